"""The S3 server of the benchmarks, s3rver (pinned in ``package.json``, installed with
``npm ci`` on first use) on 127.0.0.1, and the raw s3fs ceilings of reading a segment's
chunk objects from it.

Why s3rver: it answers a ranged GET by streaming that range from a plain file, so a range
costs the disk (or page cache) plus one HTTP exchange whatever the object's size; moto
keeps objects in Python memory and slows down badly above ~8 MiB objects. The ceilings
read with tierfs's client library and options, each from an s3fs instance set up by one
untimed HEAD (a botocore client costs ~0.1 s): what the server gives without tierfs.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks.harness.figures import MiB, Throughput
from benchmarks.harness.scenario import say
from tierfs import StoreConfig
from tierfs.engine.read.readahead import RUNS_PER_WINDOW, run_blocks_for

BENCH_DIR = Path(__file__).resolve().parent.parent  # holds package.json and package-lock.json
SERVER_SCRIPT = BENCH_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
ACCESS_KEY = SECRET_KEY = "S3RVER"  # s3rver's built-in credentials
START_TIMEOUT_S, STOP_TIMEOUT_S = 30.0, 10.0
BUCKET = "tierfs-bench"
_LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")
Layout = list[dict[str, Any]]  # a segment's chunks, as ``chunk_layout`` gives them
Client = tuple[Any, float]  # an s3fs instance set up beforehand, and the seconds that took


@dataclasses.dataclass(frozen=True)
class S3Endpoint:
    url: str
    pid: int
    key: str = ACCESS_KEY
    secret: str = SECRET_KEY

    def storage_options(self, url: str | None = None) -> dict[str, Any]:
        """fsspec/s3fs options (``url``: a proxy in front of the server)."""
        return {"endpoint_url": url or self.url, "key": self.key, "secret": self.secret}

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret)

    def create_bucket(self, bucket: str = BUCKET) -> None:
        self.client().create_bucket(Bucket=bucket)


def _require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise RuntimeError(f"{program!r} is not on PATH; the S3 server (s3rver) needs Node.js and npm")
    return path


def ensure_installed() -> Path:
    """Install s3rver into ``benchmarks/node_modules`` with ``npm ci`` if it is not there yet."""
    if not SERVER_SCRIPT.is_file():
        say(f"first use: installing s3rver with `npm ci` in {BENCH_DIR} ...")
        done = subprocess.run([_require("npm"), "ci", "--no-audit", "--no-fund"], cwd=BENCH_DIR, capture_output=True,
                              text=True)
        if done.returncode != 0 or not SERVER_SCRIPT.is_file():
            raise RuntimeError(f"`npm ci` in {BENCH_DIR} failed:\n{done.stderr.strip()}")
    return SERVER_SCRIPT


@contextmanager
def s3_server(data_dir: Path, bucket: str | None = BUCKET) -> Iterator[S3Endpoint]:
    """s3rver on 127.0.0.1 (a free port) storing objects under ``data_dir``, with ``bucket``."""
    script, node = ensure_installed(), _require("node")
    data_dir.mkdir(parents=True, exist_ok=True)
    output = data_dir.parent / f"{data_dir.name}.log"
    with open(output, "wb") as sink:
        process = subprocess.Popen([node, str(script), "-d", str(data_dir), "-a", "127.0.0.1", "-p", "0", "--silent"],
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (match := _LISTENING.search(output.read_text(errors="replace"))):
            if process.poll() is not None or time.monotonic() > deadline:
                text = output.read_text(errors="replace").strip()[-2000:]
                raise RuntimeError(f"s3rver did not start (exit code {process.poll()}): {text}")
            time.sleep(0.05)
        endpoint = S3Endpoint(f"http://127.0.0.1:{match.group(1)}", process.pid)
        if bucket:
            endpoint.create_bucket(bucket)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def new_s3fs(options: dict[str, Any], probe_url: str) -> Client:
    """A fresh s3fs instance set up by one HEAD of ``probe_url``, and its seconds."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    start_s = perf_counter()
    fs.info(probe_url)
    return fs, perf_counter() - start_s


def cat_file_ceiling(options: dict[str, Any], layout: Layout, client: Client | None = None) -> Throughput:
    """Every chunk object whole, one GET after another: the simplest client."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    start_s = perf_counter()
    total = sum(len(fs.cat_file(chunk["url"])) for chunk in layout)
    return Throughput("s3fs cat_file, whole objects one by one", total, perf_counter() - start_s, setup_s)


def cat_ranges_ceiling(options: dict[str, Any], layout: Layout, run_bytes: int, in_flight: int,
                       joined: bool = False, client: Client | None = None) -> Throughput:
    """The chunks' bytes as ``run_bytes`` ranged GETs cut at each chunk's end, ``in_flight``
    at a time; ``joined``: the pieces joined into one result, as ``cat_file`` of a segment must."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    ranges = [(chunk["url"], chunk.get("object_offset", 0) + start,
               chunk.get("object_offset", 0) + min(start + run_bytes, chunk["end"] - chunk["start"]))
              for chunk in layout for start in range(0, chunk["end"] - chunk["start"], run_bytes)]
    paths, starts, ends = (list(column) for column in zip(*ranges, strict=True))
    start_s = perf_counter()
    pieces = fs.cat_ranges(paths, starts, ends, batch_size=in_flight, on_error="raise")
    nbytes = len(b"".join(pieces)) if joined else sum(len(piece) for piece in pieces)
    label = f"s3fs cat_ranges, {run_bytes / MiB:g} MiB ranges, {in_flight} in flight" + (", joined" if joined else "")
    return Throughput(label, nbytes, perf_counter() - start_s, setup_s)


def readahead_ceiling(options: dict[str, Any], layout: Layout, client: Client | None = None) -> Throughput:
    """The bound of a cold tierfs read: the GET size and concurrency of its read-ahead
    at full window, without tierfs."""
    run_bytes = run_blocks_for(StoreConfig().readahead_max_bytes) * MiB
    return cat_ranges_ceiling(options, layout, run_bytes, RUNS_PER_WINDOW, client=client)
