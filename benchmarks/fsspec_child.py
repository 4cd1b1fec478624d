"""The reading process of the fsspec benchmark (``benchmarks/fsspec_api.py``):
``python -m benchmarks.fsspec_child --child``, with ``TIERFS_DATA_DIR`` set to the
daemon's data dir, answers one JSON command per stdin line with one JSON line on stdout
(``benchmarks.children``).

Commands: ``hash`` (the segment through fsspec, sha256), ``scan_open`` ((a)/(d):
``fsspec.open`` then ``f.read(n)`` until EOF), ``scan_cat`` ((b): ``fs.cat_file`` of
consecutive ranges), ``scan_pread`` ((r), the ceiling of (a)), ``small_reads`` (4 KiB
``cat_file`` at given offsets) and ``socket_sink`` ((c): receive bytes from a Unix
socket). Only the reading is timed; every scan reports the CPU this process spent.

(r) does what (a) must do per block and nothing else: with the layout the daemon hands
out (asked once, untimed), each chunk file opened once, every whole 1 MiB block
``pread`` into a new ``bytes`` and checked against the layout's CRC32C (the same
``crc32c`` the direct reader uses), blocks handed out one by one without a join, as
``f.read(1 MiB)`` hands them out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks.children import JsonLineChild
from benchmarks.common import EXIT_OK, Latency
from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.testing.harness import process_environment

CHILD_FLAG = "--child"


def _fetched(fs: Any, before: tuple[int, int]) -> dict[str, int]:
    return {"fetched_daemon_bytes": fs.bytes_fetched_daemon - before[0],
            "fetched_direct_bytes": fs.bytes_fetched_direct - before[1]}


def scan_open(state: dict[str, Any], read_bytes: int, direct: bool = True) -> dict[str, Any]:
    import fsspec

    fs = state["fs"] if direct else state["fs_daemon"]
    fetched_before = fs.bytes_fetched_daemon, fs.bytes_fetched_direct
    # untimed: stats the segment
    f = fsspec.open(state["url"], "rb", **({} if direct else {"direct_reads": False})).open()
    try:
        nbytes = 0
        cpu_before = sum(os.times()[:2])
        start_s = perf_counter()
        while data := f.read(read_bytes):
            nbytes += len(data)
        seconds = perf_counter() - start_s
        cpu_s = sum(os.times()[:2]) - cpu_before
    finally:
        f.close()
    # fsspec.open reuses the cached TierFileSystem instance (same arguments), so its
    # counters include this scan's fetches.
    return {"seconds": seconds, "nbytes": nbytes, "cpu_s": cpu_s, **_fetched(fs, fetched_before)}


def scan_cat(state: dict[str, Any], range_bytes: int, size: int) -> dict[str, Any]:
    fs, path = state["fs"], state["path"]
    fetched_before = fs.bytes_fetched_daemon, fs.bytes_fetched_direct
    nbytes = 0
    cpu_before = sum(os.times()[:2])
    start_s = perf_counter()
    for offset in range(0, size, range_bytes):
        nbytes += len(fs.cat_file(path, offset, min(size, offset + range_bytes)))
    seconds = perf_counter() - start_s
    cpu_s = sum(os.times()[:2]) - cpu_before
    return {"seconds": seconds, "nbytes": nbytes, "cpu_s": cpu_s, **_fetched(fs, fetched_before)}


def scan_pread(state: dict[str, Any]) -> dict[str, Any]:
    """(r): every block of the segment's chunk files by ``pread`` + CRC32C check."""
    layout = state["fs"].chunk_layout(state["path"])  # untimed, as (a)'s open
    chunks = []
    for chunk in layout:
        if not chunk["url"].startswith("file://"):
            raise RuntimeError(f"chunk {chunk['url']} is not a local file")
        chunks.append((chunk["url"][len("file://"):], int(chunk["end"]) - int(chunk["start"]),
                       [int(crc) for crc in chunk["block_crc32c"]]))
    nbytes = 0
    cpu_before = sum(os.times()[:2])
    start_s = perf_counter()
    for path, length, crcs in chunks:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for index, block_start in enumerate(range(0, length, BLOCK_BYTES)):
                block = os.pread(fd, min(BLOCK_BYTES, length - block_start), block_start)
                if crc32c(block) != crcs[index]:
                    raise RuntimeError(f"{path} block {index} failed its CRC32C check")
                nbytes += len(block)
        finally:
            os.close(fd)
    seconds = perf_counter() - start_s
    cpu_s = sum(os.times()[:2]) - cpu_before
    return {"seconds": seconds, "nbytes": nbytes, "cpu_s": cpu_s, "fetched_daemon_bytes": 0,
            "fetched_direct_bytes": nbytes}


def sha256_of_segment(state: dict[str, Any], read_bytes: int) -> dict[str, Any]:
    import fsspec

    digest = hashlib.sha256()
    nbytes = 0
    with fsspec.open(state["url"], "rb") as f:
        while data := f.read(read_bytes):
            digest.update(data)
            nbytes += len(data)
    return {"sha256": digest.hexdigest(), "nbytes": nbytes}


def small_reads(state: dict[str, Any], offsets: list[int], length: int) -> dict[str, Any]:
    fs, path = state["fs"], state["path"]
    latencies_s = []
    for offset in offsets:
        start_s = perf_counter()
        fs.cat_file(path, offset, offset + length)
        latencies_s.append(perf_counter() - start_s)
    return dataclasses.asdict(Latency.of(latencies_s))


def socket_sink(path: str, size: int, piece: int) -> dict[str, Any]:
    """Receive ``size`` bytes from the Unix socket at ``path``, each ``piece`` into a new
    bytearray (what a read returns)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        nbytes = 0
        start_s = perf_counter()
        while nbytes < size:
            buffer = bytearray(min(piece, size - nbytes))
            view = memoryview(buffer)
            got = 0
            while got < len(buffer):
                received = sock.recv_into(view[got:])
                if not received:
                    raise RuntimeError("the socket closed early")
                got += received
            nbytes += got
        seconds = perf_counter() - start_s
    return {"seconds": seconds, "nbytes": nbytes}


def child_main(segment: str) -> int:
    """Answer one JSON command per stdin line with one JSON line on stdout."""
    import fsspec

    state: dict[str, Any] = {"path": segment, "url": f"tierfs://{segment}"}
    state["fs"] = fsspec.filesystem("tierfs")  # finds the daemon through TIERFS_DATA_DIR
    state["fs_daemon"] = fsspec.filesystem("tierfs", direct_reads=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "hash":
            result = sha256_of_segment(state, **command)
        elif op == "scan_open":
            result = scan_open(state, **command)
        elif op == "scan_cat":
            result = scan_cat(state, **command)
        elif op == "scan_pread":
            result = scan_pread(state)
        elif op == "small_reads":
            result = small_reads(state, **command)
        elif op == "socket_sink":
            result = socket_sink(**command)
        else:
            raise ValueError(f"unknown command {op!r}")
        print(json.dumps(result), flush=True)
    return EXIT_OK


class Child(JsonLineChild):
    """The fsspec reader process (see ``child_main``); its stderr goes to ``log_path``."""

    def __init__(self, daemon_data_dir: Path, segment: str, log_path: Path) -> None:
        env = process_environment({"TIERFS_DATA_DIR": str(daemon_data_dir)}, drop_tierfs=True)
        super().__init__("benchmarks.fsspec_child", CHILD_FLAG, log_path, env)
        self.request({"segment": segment})  # answered by "ready"

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return self.request({"op": op, **args})


if __name__ == "__main__" and sys.argv[1:2] == [CHILD_FLAG]:
    sys.exit(child_main(json.loads(sys.stdin.readline())["segment"]))
