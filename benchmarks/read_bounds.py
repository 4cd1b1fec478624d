"""What bounds a cold sequential read on s3rver, measured beside it (``benchmarks read``
and ``benchmarks fuse`` use these).

- CPU accounting: the S3 server's CPU (``/proc/<pid>/stat`` of s3rver's node process,
  found by its data directory on the command line) and the client's (``getrusage`` of
  the measuring process, or of the child that measured) around each measurement, the
  clients set up before it (creating a botocore client costs ~0.1-0.2 s of CPU), so a
  report can say where the time went: s3rver is one Node thread on the same 2 CPUs.
- The bound: raw s3fs ``cat_ranges`` of the same bytes with the request sizes and the
  concurrency tierfs's read-ahead uses (runs of ``run_blocks_for(readahead_max_bytes)``
  blocks cut at chunk ends, ``RUNS_PER_WINDOW`` in flight): s3rver's own throughput
  for tierfs's requests, without tierfs.
- fsspec direct reads: ``DirectChunkReader.read`` of the whole segment with the layout
  the daemon hands out, which is what ``TierFileSystem.cat_file`` does after its one
  layout request: the client reads the chunk objects itself, in runs. Its ceiling
  (``raw_whole_joined``) does the same work without tierfs: the whole objects with the
  same concurrency, joined into one result of the segment's size (which whole-object
  ``cat_file`` one by one, discarding each, never builds).
"""

from __future__ import annotations

import dataclasses
import os
import resource
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any, TypeVar

from benchmarks.common import MiB, Throughput
from tierfs.blocks.filesystems import open_filesystem
from tierfs.engine.read.readahead import RUNS_PER_WINDOW, run_blocks_for
from tierfs.remote.direct_read import RUN_BLOCKS, RUNS_IN_FLIGHT, DirectChunkReader, SegmentLayout

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent during one measurement: the S3 server's and the client's."""

    server_s: float
    client_s: float


def process_cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def s3rver_pid(data_dir: Path) -> int | None:
    """The pid of the s3rver process serving ``data_dir`` (None if not found)."""
    needle = str(data_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if b"s3rver" in command and needle in command:
            return int(entry)
    return None


def process_cpu_of(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (0.0 when it is unknown or gone)."""
    from benchmarks.process_cpu import own_cpu_s

    return own_cpu_s(pid) if pid is not None else 0.0


def measured(server_pid: int | None, run: Callable[[], T], client_cpu_s: Callable[[T], float] | None = None,
             ) -> tuple[T, CpuUse]:
    """``run()`` and the CPU it cost: the server's, and this process's (or, for work
    done in a child, what ``client_cpu_s(result)`` says the child spent)."""
    server_before, client_before = process_cpu_of(server_pid), process_cpu_s()
    result = run()
    client_s = client_cpu_s(result) if client_cpu_s else process_cpu_s() - client_before
    return result, CpuUse(process_cpu_of(server_pid) - server_before, client_s)


def run_ranges(layout: list[dict[str, Any]], run_bytes: int) -> tuple[list[str], list[int], list[int]]:
    """The chunks' bytes as ranges of ``run_bytes`` (cut at each chunk's end; a chunk
    packed with others starts at its ``object_offset`` in the object)."""
    paths: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for chunk in layout:
        length = chunk["end"] - chunk["start"]
        place = chunk.get("object_offset", 0)
        for start in range(0, length, run_bytes):
            paths.append(chunk["url"])
            starts.append(place + start)
            ends.append(place + min(start + run_bytes, length))
    return paths, starts, ends


def readahead_requests(readahead_max_bytes: int) -> tuple[int, int]:
    """(bytes per GET, GETs in flight) of tierfs's read-ahead at full window."""
    return run_blocks_for(readahead_max_bytes) * MiB, RUNS_PER_WINDOW


def raw_runs(options: dict[str, Any], layout: list[dict[str, Any]], run_bytes: int, in_flight: int,
             client: tuple[Any, float] | None = None) -> Throughput:
    """The bound: s3fs ``cat_ranges`` of the segment's objects in ``run_bytes`` ranges,
    ``in_flight`` at a time (same client library and options as tierfs; ``client``: an
    s3fs set up beforehand by ``new_s3fs``, or one is set up here)."""
    from benchmarks.read import new_s3fs

    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    paths, starts, ends = run_ranges(layout, run_bytes)
    start_s = perf_counter()
    data = fs.cat_ranges(paths, starts, ends, batch_size=in_flight, on_error="raise")
    elapsed_s = perf_counter() - start_s
    label = f"bound: s3fs cat_ranges, {run_bytes // MiB} MiB ranges, {in_flight} in flight"
    return Throughput.of(label, sum(len(piece) for piece in data), elapsed_s, setup_s)


def raw_whole_joined(options: dict[str, Any], layout: list[dict[str, Any]], in_flight: int,
                     client: tuple[Any, float] | None = None) -> Throughput:
    """The ceiling for (i): s3fs ``cat_ranges`` of every object whole, ``in_flight`` at
    a time, joined into one result, as ``cat_file`` of the segment must return it."""
    from benchmarks.read import new_s3fs

    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    paths = [chunk["url"] for chunk in layout]
    starts = [chunk.get("object_offset", 0) for chunk in layout]  # a packed chunk's place
    ends = [start + chunk["end"] - chunk["start"] for start, chunk in zip(starts, layout, strict=True)]
    start_s = perf_counter()
    data = b"".join(fs.cat_ranges(paths, starts, ends, batch_size=in_flight, on_error="raise"))
    elapsed_s = perf_counter() - start_s
    label = f"s3fs cat_ranges, whole objects, {in_flight} in flight, joined"
    return Throughput.of(label, len(data), elapsed_s, setup_s)


@dataclasses.dataclass(frozen=True)
class DirectRead:
    throughput: Throughput
    gets: int  # ranged GETs of chunk objects the read made


def direct_read(options: dict[str, Any], layout: list[dict[str, Any]], expected: bytes | None = None) -> DirectRead:
    """fsspec direct read: the whole segment through a fresh ``DirectChunkReader`` (the
    S3 client it will use set up by one untimed HEAD, as the ceilings' are)."""
    fs, path = open_filesystem(layout[0]["url"], options)  # the instance the reader gets
    start_s = perf_counter()
    fs.info(path)
    setup_s = perf_counter() - start_s
    segment = SegmentLayout.from_json(layout)
    reader = DirectChunkReader(dict(options))
    start_s = perf_counter()
    data = reader.read(segment, 0, segment.flushed_end)
    elapsed_s = perf_counter() - start_s
    if expected is not None and data != expected:
        raise RuntimeError("the direct read returned other bytes than were appended")
    label = f"fsspec direct read (runs of {RUN_BLOCKS} MiB, {RUNS_IN_FLIGHT} in flight)"
    return DirectRead(Throughput.of(label, len(data), elapsed_s, setup_s), reader.gets)
