"""The S3 server of the benchmarks, s3rver (npm) on 127.0.0.1, and the raw s3fs ceilings
of reading a segment's chunk objects from it.

Why s3rver: it stores each object as a plain file and answers a ranged GET by streaming
that range from the file, so a range costs what the disk (or page cache) costs plus one
HTTP exchange, whatever the object's size. moto, the tests' server, keeps objects in
Python memory and slows down badly above ~8 MiB objects: it would measure moto.

s3rver is pinned in ``benchmarks/package.json`` and ``package-lock.json``; on first use
(no ``benchmarks/node_modules``) it is installed with ``npm ci``. ``s3_server`` starts
it on a free port with a data directory of the caller's and stops it on exit.

The ceilings read with the same client library and options as tierfs, each from an s3fs
instance whose client one untimed HEAD has set up (creating a botocore client costs
~0.1 s): what the server gives without tierfs.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO, TypeVar

from benchmarks.harness import procfs
from benchmarks.harness.figures import MiB, Throughput

BENCH_DIR = Path(__file__).resolve().parent.parent  # holds package.json and package-lock.json
SERVER_SCRIPT = BENCH_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
ACCESS_KEY = SECRET_KEY = "S3RVER"  # s3rver's built-in credentials
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
BUCKET = "tierfs-bench"
_LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")
T = TypeVar("T")
Layout = list[dict[str, Any]]  # a segment's chunks, as ``chunk_layout`` gives them


class S3ServerError(RuntimeError):
    """The S3 server could not be installed or started (the message says why)."""


@dataclasses.dataclass(frozen=True)
class S3Endpoint:
    url: str
    pid: int
    key: str = ACCESS_KEY
    secret: str = SECRET_KEY

    def storage_options(self, url: str | None = None) -> dict[str, Any]:
        """fsspec/s3fs options for this endpoint (or for ``url``, a proxy in front of it)."""
        return {"endpoint_url": url or self.url, "key": self.key, "secret": self.secret}

    def environment(self) -> dict[str, str]:
        """The credentials for a process that reads them from the environment."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self) -> Any:
        """A boto3 client straight to the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret)

    def create_bucket(self, bucket: str = BUCKET) -> None:
        self.client().create_bucket(Bucket=bucket)


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
        raise S3ServerError(f"{BENCH_DIR}/package.json not found: run the benchmark from a source checkout")
    npm = _require("npm")
    verb = "ci" if (BENCH_DIR / "package-lock.json").is_file() else "install"
    print(f"first use: installing s3rver with `npm {verb}` in {BENCH_DIR} ...", file=log, flush=True)
    done = subprocess.run([npm, verb, "--no-audit", "--no-fund"], cwd=BENCH_DIR, capture_output=True, text=True)
    if done.returncode != 0 or not SERVER_SCRIPT.is_file():
        raise S3ServerError(f"`npm {verb}` in {BENCH_DIR} failed:\n{done.stderr.strip()}")
    return SERVER_SCRIPT


@contextmanager
def s3_server(data_dir: Path, log: TextIO = sys.stderr, bucket: str | None = BUCKET) -> Iterator[S3Endpoint]:
    """s3rver on 127.0.0.1 (a free port) storing objects under ``data_dir``, with ``bucket``."""
    script, node = ensure_installed(log), _require("node")
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
                raise S3ServerError(f"s3rver did not start (exit code {process.poll()}): {text}")
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


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """CPU seconds one measurement cost: the S3 server's and the client's."""

    server_s: float
    client_s: float


def measured(server_pid: int | None, run: Callable[[], T], client_cpu_s: Callable[[T], float] | None = None
             ) -> tuple[T, CpuUse]:
    """``run()`` and its CPU: the server's, and this process's (or, for work done in a
    child, what ``client_cpu_s(result)`` says the child spent)."""
    server_before, client_before = procfs.cpu_s(server_pid), procfs.self_cpu_s()
    result = run()
    client_s = client_cpu_s(result) if client_cpu_s else procfs.self_cpu_s() - client_before
    return result, CpuUse(procfs.cpu_s(server_pid) - server_before, client_s)


def new_s3fs(options: dict[str, Any], probe_url: str) -> tuple[Any, float]:
    """A fresh s3fs instance whose client one HEAD of ``probe_url`` has set up, and the
    seconds that took."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    start_s = perf_counter()
    fs.info(probe_url)
    return fs, perf_counter() - start_s


def ranges(layout: Layout, run_bytes: int) -> tuple[list[str], list[int], list[int]]:
    """The chunks' bytes as ranges of ``run_bytes`` cut at each chunk's end (a chunk
    packed with others starts at its ``object_offset`` in the object)."""
    paths: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for chunk in layout:
        length, place = chunk["end"] - chunk["start"], chunk.get("object_offset", 0)
        for start in range(0, length, run_bytes):
            paths.append(chunk["url"])
            starts.append(place + start)
            ends.append(place + min(start + run_bytes, length))
    return paths, starts, ends


def cat_file_ceiling(options: dict[str, Any], layout: Layout, client: tuple[Any, float] | None = None
                     ) -> Throughput:
    """Every chunk object whole, one GET after another: the simplest client (``client``:
    from ``new_s3fs``, set up beforehand, e.g. outside a CPU measurement)."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    start_s = perf_counter()
    total = sum(len(fs.cat_file(chunk["url"])) for chunk in layout)
    return Throughput("s3fs cat_file, whole objects one by one", total, perf_counter() - start_s, setup_s)


def cat_ranges_ceiling(options: dict[str, Any], layout: Layout, run_bytes: int, in_flight: int,
                       joined: bool = False, client: tuple[Any, float] | None = None) -> Throughput:
    """The same bytes as ``run_bytes`` ranged GETs, ``in_flight`` at a time (a sliding
    window); ``joined``: the pieces joined into one result, as ``cat_file`` of a segment
    must return it."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    paths, starts, ends = ranges(layout, run_bytes)
    start_s = perf_counter()
    pieces = fs.cat_ranges(paths, starts, ends, batch_size=in_flight, on_error="raise")
    nbytes = len(b"".join(pieces)) if joined else sum(len(piece) for piece in pieces)
    label = f"s3fs cat_ranges, {run_bytes / MiB:g} MiB ranges, {in_flight} in flight" + (", joined" if joined else "")
    return Throughput(label, nbytes, perf_counter() - start_s, setup_s)


def readahead_ceiling(options: dict[str, Any], layout: Layout, client: tuple[Any, float] | None = None
                      ) -> Throughput:
    """The bound of a cold tierfs read: the GET size and concurrency of its read-ahead
    at full window, without tierfs."""
    from tierfs import StoreConfig
    from tierfs.engine.read.readahead import RUNS_PER_WINDOW, run_blocks_for

    run_bytes = run_blocks_for(StoreConfig().readahead_max_bytes) * MiB
    return cat_ranges_ceiling(options, layout, run_bytes, RUNS_PER_WINDOW, client=client)
