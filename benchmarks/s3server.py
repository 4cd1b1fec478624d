"""A throw-away S3-protocol server for benchmarks: s3rver (npm) on 127.0.0.1.

Why s3rver: it stores each object as a plain file and answers a ranged GET by
streaming that byte range from the file (``fs.createReadStream`` with start/end), so a
range costs what the disk (or page cache) costs plus one HTTP exchange, whatever the
object's size. moto, the server the tests use, keeps objects in Python memory and
slows down badly above ~8 MiB objects, so it would measure moto rather than tierfs.

The server is pinned in ``benchmarks/package.json`` / ``benchmarks/package-lock.json``,
beside this module. On first use (no ``benchmarks/node_modules``) it is installed with
``npm ci``; after that it starts in well under a second. ``S3Server`` starts it on a free
port (``-p 0``; the port is read back from its start-up line) with a data directory the
caller provides, and stops it on exit. Credentials are s3rver's defaults; buckets are
created with boto3 (path-style requests, region us-east-1).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

BENCH_DIR = Path(__file__).resolve().parent  # holds package.json and package-lock.json
SERVER_SCRIPT = BENCH_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
ACCESS_KEY = SECRET_KEY = "S3RVER"  # s3rver's built-in credentials
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")


class S3ServerError(RuntimeError):
    """The S3 server could not be installed or started (the message says why)."""


@dataclasses.dataclass(frozen=True)
class S3Endpoint:
    url: str
    key: str = ACCESS_KEY
    secret: str = SECRET_KEY

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for this endpoint (``StoreConfig.tier2_options``)."""
        return {"endpoint_url": self.url, "key": self.key, "secret": self.secret}

    def create_bucket(self, bucket: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
        )
        client.create_bucket(Bucket=bucket)


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise S3ServerError(f"{program!r} is not on PATH; the S3 server (s3rver) needs Node.js and npm")
    return path


def ensure_installed(log: TextIO) -> Path:
    """Install s3rver into ``benchmarks/node_modules`` with npm if it is not there yet."""
    if SERVER_SCRIPT.is_file():
        return SERVER_SCRIPT
    if not (BENCH_DIR / "package.json").is_file():
        raise S3ServerError(
            f"{BENCH_DIR}/package.json not found: run the benchmark from a source checkout"
        )
    npm = _require("npm")
    verb = "ci" if (BENCH_DIR / "package-lock.json").is_file() else "install"
    print(f"first use: installing s3rver with `npm {verb}` in {BENCH_DIR} ...", file=log, flush=True)
    done = subprocess.run(
        [npm, verb, "--no-audit", "--no-fund"], cwd=BENCH_DIR, capture_output=True, text=True
    )
    if done.returncode != 0 or not SERVER_SCRIPT.is_file():
        raise S3ServerError(f"`npm {verb}` in {BENCH_DIR} failed:\n{done.stderr.strip()}")
    print("s3rver installed", file=log, flush=True)
    return SERVER_SCRIPT


def _wait_for_port(process: subprocess.Popen[bytes], output: Path) -> int:
    """The port from s3rver's 'S3rver listening on ADDRESS:PORT' line."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = _LISTENING.search(output.read_text(errors="replace"))
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.05)
    text = output.read_text(errors="replace").strip()
    raise S3ServerError(f"s3rver did not start (exit code {process.poll()}): {text[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def s3_server(data_dir: Path, log: TextIO = sys.stderr) -> Iterator[S3Endpoint]:
    """Run s3rver on 127.0.0.1 (a free port) storing objects under ``data_dir``."""
    script = ensure_installed(log)
    node = _require("node")
    data_dir.mkdir(parents=True, exist_ok=True)
    output = data_dir.parent / f"{data_dir.name}.log"
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [node, str(script), "-d", str(data_dir), "-a", "127.0.0.1", "-p", "0", "--silent"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        port = _wait_for_port(process, output)
        yield S3Endpoint(f"http://127.0.0.1:{port}")
    finally:
        _stop(process)
