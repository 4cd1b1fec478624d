"""The reading process of the fsspec benchmark: ``python -m benchmarks.fsspec.child
SEGMENT``, with ``TIERFS_DATA_DIR`` set to the daemon's data dir, answers one JSON
command per stdin line with one JSON line (``harness.child``).

Commands: ``hash`` (the segment through fsspec, sha256), ``scan_open`` ((a), (d):
``fsspec.open`` then ``f.read(n)`` until EOF), ``scan_pread`` ((r)), ``small_reads``
(4 KiB ``cat_file`` at given offsets) and ``socket_sink`` ((c): bytes from a Unix socket,
each piece into a new ``bytearray``). Only the reading is timed; every scan reports this
process's CPU.

(r), the ceiling of (a), does what (a) must do per block and nothing else: with the
layout the daemon hands out (asked once, untimed), each chunk file opened once, every
whole 1 MiB block ``pread`` into a new ``bytes`` and checked against the layout's CRC32C
(the ``crc32c`` the direct reader uses), handed out one by one, as ``f.read(1 MiB)`` does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import sys
from collections.abc import Iterator
from time import perf_counter
from typing import Any

from benchmarks.harness.child import serve
from benchmarks.harness.figures import Latency
from tierfs.blocks.checksums import BLOCK_BYTES, crc32c


def timed(pieces: Iterator[int]) -> dict[str, Any]:
    """Seconds, bytes and CPU of reading ``pieces`` (each the length of a piece read)."""
    cpu_before, start_s = sum(os.times()[:2]), perf_counter()
    nbytes = sum(pieces)
    return {"seconds": perf_counter() - start_s, "nbytes": nbytes, "cpu_s": sum(os.times()[:2]) - cpu_before}


class Reader:
    def __init__(self, segment: str) -> None:
        import fsspec

        self.path, self.url = segment, f"tierfs://{segment}"
        self.fs = fsspec.filesystem("tierfs")  # finds the daemon through TIERFS_DATA_DIR

    def hash(self, read_bytes: int) -> dict[str, Any]:
        import fsspec

        digest, nbytes = hashlib.sha256(), 0
        with fsspec.open(self.url, "rb") as f:
            while data := f.read(read_bytes):
                digest.update(data)
                nbytes += len(data)
        return {"sha256": digest.hexdigest(), "nbytes": nbytes}

    def scan_open(self, read_bytes: int, direct: bool = True) -> dict[str, Any]:
        import fsspec

        # untimed: the open stats the segment
        with fsspec.open(self.url, "rb", **({} if direct else {"direct_reads": False})) as f:
            return timed(len(data) for data in iter(lambda: f.read(read_bytes), b""))

    def scan_pread(self) -> dict[str, Any]:
        chunks = []
        for chunk in self.fs.chunk_layout(self.path):  # untimed, as (a)'s open
            if not chunk["url"].startswith("file://"):
                raise RuntimeError(f"chunk {chunk['url']} is not a local file")
            chunks.append((chunk["url"][len("file://"):], int(chunk["end"]) - int(chunk["start"]),
                           [int(crc) for crc in chunk["block_crc32c"]]))

        def pieces() -> Iterator[int]:
            for path, length, crcs in chunks:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    for index, start in enumerate(range(0, length, BLOCK_BYTES)):
                        block = os.pread(fd, min(BLOCK_BYTES, length - start), start)
                        if crc32c(block) != crcs[index]:
                            raise RuntimeError(f"{path} block {index} failed its CRC32C check")
                        yield len(block)
                finally:
                    os.close(fd)

        return timed(pieces())

    def small_reads(self, offsets: list[int], length: int) -> dict[str, Any]:
        latencies_s = []
        for offset in offsets:
            start_s = perf_counter()
            self.fs.cat_file(self.path, offset, offset + length)
            latencies_s.append(perf_counter() - start_s)
        return dataclasses.asdict(Latency.of(latencies_s))

    @staticmethod
    def socket_sink(path: str, size: int, piece: int) -> dict[str, Any]:
        def pieces() -> Iterator[int]:
            nbytes = 0
            while nbytes < size:
                view = memoryview(bytearray(min(piece, size - nbytes)))
                got = 0
                while got < len(view):
                    received = sock.recv_into(view[got:])
                    if not received:
                        raise RuntimeError("the socket closed early")
                    got += received
                nbytes += got
                yield got

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            return timed(pieces())


def main(segment: str) -> int:
    reader = Reader(segment)
    print('{"ready": true}', flush=True)
    return serve(lambda command: getattr(reader, command.pop("op"))(**command))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
