"""The FUSE benchmark's sustained VD write (issue 19, item 7): what a writer keeps up
through a tierfs mount once the flush backlog is full, upload to tier-2 included, next
to one ``write(2)`` per request to the same disk.

A 256 MiB ``dd`` burst lands in the journal and returns before the storage writer has
uploaded much of it: its rate is the journal's, and the upload happens after the clock
stopped. A writer that keeps writing fills the backlog (``max_backlog_bytes``, 1 GiB by
default); from then on the mount refuses appends (``ENOSPC``, "retry later") until
flushes make room, so what it sustains is bounded by the upload. Here:

- ``write_requests``: one ``os.write`` of 1 MiB per request (``direct_io``: one FUSE
  write each, as ``dd bs=1M``) of zeros until ``total_bytes`` are written, retrying a
  refused request (``ENOSPC``) after ``REFUSAL_WAIT_S`` (10 ms); the file closed; then
  for tierfs ``client.op("flush")`` (every byte in tier-2). Timed from the first write
  to the flush's return: the sustained rate includes the upload. Every run starts
  after an untimed ``sync(2)``.
- the ceiling: the same writer into the minimal pyfuse3 filesystem's ``journal`` file
  (``benchmarks/fuse_ceiling.py``: one ``write(2)`` per request to a file on the data
  disk, what tierfs's VD does before it acknowledges), measured seconds before.
- the upload bound: s3fs ``pipe_file`` of ``max_flush_bytes`` (16 MiB) objects of the
  same bytes, one after another, to the same server: what the storage writer does per
  segment (one flush at a time, each one object on S3, which cannot append), without
  the journal, the CRCs and the metadata commits.

Invariant: a refused request wrote nothing (tierfs checks the backlog before the
journal write), so retrying it writes each byte exactly once; the flushed length is
checked against the bytes written.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable
from pathlib import Path
from time import perf_counter, sleep
from typing import TYPE_CHECKING, Any, TextIO

from benchmarks.common import MiB, Throughput

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

REQUEST_BYTES = MiB  # one FUSE write per request under direct_io, as dd bs=1M
# Wait before retrying a refused request. While requests are refused the backlog is
# full (1 GiB), so the storage writer always has bytes to upload and the wait costs the
# sustained rate nothing; each refusal is a FUSE round trip the daemon answers on the
# CPUs the upload needs (with 1 ms: ~3,000 per 2 GiB run), so poll every 10 ms.
REFUSAL_WAIT_S = 0.01
UPLOAD_BOUND_BYTES = 256 * MiB  # enough objects for a stable rate, seconds per round


@dataclasses.dataclass(frozen=True)
class SustainedWrite:
    nbytes: int
    write_s: float  # first write to the close of the file
    total_s: float  # to every byte in tier-2 (the flush's return); write_s for the ceiling
    refusals: int  # requests refused with ENOSPC (backlog full) and retried
    bytes_before_refusal: int  # written before the first refusal (all of them if none)
    first_refusal_s: float | None  # when the backlog was first full

    @property
    def sustained(self) -> Throughput:
        return Throughput.of("sustained write, upload included", self.nbytes, self.total_s)

    @property
    def burst(self) -> Throughput:
        """The rate until the backlog was first full (the whole write if it never was)."""
        seconds = self.first_refusal_s if self.first_refusal_s is not None else self.write_s
        return Throughput.of("until the backlog was full", self.bytes_before_refusal, seconds)


@dataclasses.dataclass(frozen=True)
class SustainedRound:
    ceiling: SustainedWrite  # one write(2) per request to the data disk
    upload: Throughput  # the upload bound
    upload_server_cpu_s: float  # s3rver's CPU during the upload bound
    tierfs: SustainedWrite
    daemon_cpu_s: float  # the mount daemon's CPU during the tierfs write and flush
    server_cpu_s: float  # s3rver's meanwhile

    @property
    def ratio(self) -> float:
        return self.tierfs.sustained.mb_per_s / self.ceiling.sustained.mb_per_s

    @property
    def upload_ratio(self) -> float:
        return self.tierfs.sustained.mb_per_s / self.upload.mb_per_s


def write_requests(path: Path, total_bytes: int, after: Callable[[], None] | None = None) -> SustainedWrite:
    """``total_bytes`` of zeros into ``path``, one ``os.write`` per ``REQUEST_BYTES``,
    the file closed, then ``after()``; the clock runs until it returns."""
    view = memoryview(bytes(REQUEST_BYTES))
    os.sync()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = refusals = 0
    before_refusal, first_refusal_s = total_bytes, None
    start_s = perf_counter()
    try:
        while written < total_bytes:
            try:
                written += os.write(fd, view[: min(REQUEST_BYTES, total_bytes - written)])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if first_refusal_s is None:
                    first_refusal_s, before_refusal = perf_counter() - start_s, written
                refusals += 1
                sleep(REFUSAL_WAIT_S)
    finally:
        os.close(fd)
    write_s = perf_counter() - start_s
    if after is not None:
        after()
    return SustainedWrite(written, write_s, perf_counter() - start_s, refusals, before_refusal, first_refusal_s)


def upload_bound(options: dict[str, Any], bucket: str, object_bytes: int) -> Throughput:
    """s3fs ``pipe_file`` of ``object_bytes`` objects one after another, UPLOAD_BOUND_BYTES
    in all (client set up by one untimed HEAD), then deleted."""
    from benchmarks.read import new_s3fs

    fs, setup_s = new_s3fs(options, bucket)
    data = bytes(object_bytes)
    count = max(1, UPLOAD_BOUND_BYTES // object_bytes)
    start_s = perf_counter()
    for index in range(count):
        fs.pipe_file(f"{bucket}/upload-bound/{index}", data)
    seconds = perf_counter() - start_s
    fs.rm(f"{bucket}/upload-bound", recursive=True)
    label = f"s3fs pipe_file, {object_bytes // MiB} MiB objects one after another"
    return Throughput.of(label, count * object_bytes, seconds, setup_s)


def sustained_round(ceiling_file: Path, tierfs_dir: Path, name: str, total_bytes: int, client: TierClient,
                    options: dict[str, Any], bucket: str, cpu_of: Callable[[], tuple[float, float]]
                    ) -> SustainedRound:
    """The ceiling, the upload bound and tierfs, one after another; ``cpu_of()`` gives
    (mount daemon, s3rver) CPU seconds so far. The tierfs segment is deleted after."""
    from tierfs.contracts.config import StoreConfig
    from tierfs.contracts.info import SegmentInfo

    ceiling = write_requests(ceiling_file, total_bytes)
    server_before = cpu_of()[1]
    upload = upload_bound(options, bucket, StoreConfig().max_flush_bytes)
    upload_server_cpu_s = cpu_of()[1] - server_before
    daemon_before, server_before = cpu_of()
    tierfs = write_requests(tierfs_dir / name, total_bytes, lambda: client.op("flush", path=name))
    daemon_after, server_after = cpu_of()
    info = client.stat(name)
    if not isinstance(info, SegmentInfo) or info.flushed_length != total_bytes:
        raise RuntimeError(f"{name}: {info} after writing and flushing {total_bytes} bytes")
    client.delete(name)
    return SustainedRound(ceiling, upload, upload_server_cpu_s, tierfs, daemon_after - daemon_before,
                          server_after - server_before)


def format_sustained(rounds: list[SustainedRound]) -> list[str]:
    lines = [f"{'sustained VD write, direct_io':<30} {'ceiling':>9} {'upload':>8} {'tierfs':>8} "
             f"{'burst':>8} {'refused':>8} {'t/ceil':>7} {'t/upl':>6}  MB/s; CPU ms per MiB"]
    for index, r in enumerate(rounds, 1):
        lines.append(f"{'round ' + str(index) + f' ({r.tierfs.nbytes // MiB} MiB)':<30} "
                     f"{r.ceiling.sustained.mb_per_s:9,.1f} {r.upload.mb_per_s:8,.1f} "
                     f"{r.tierfs.sustained.mb_per_s:8,.1f} {r.tierfs.burst.mb_per_s:8,.1f} "
                     f"{r.tierfs.refusals:8d} {r.ratio:7.3f} {r.upload_ratio:6.3f}  tierfs: daemon "
                     f"{r.daemon_cpu_s * 1000 / (r.tierfs.nbytes / MiB):.2f}, s3rver "
                     f"{r.server_cpu_s * 1000 / (r.tierfs.nbytes / MiB):.2f}; upload bound: s3rver "
                     f"{r.upload_server_cpu_s * 1000 / (r.upload.nbytes / MiB):.2f}")
        first = r.tierfs.first_refusal_s
        lines.append(f"  tierfs: backlog full after {r.tierfs.bytes_before_refusal / MiB:,.0f} MiB"
                     + (f" ({first:.2f} s)" if first is not None else " (never)")
                     + f", last write returned at {r.tierfs.write_s:.2f} s, all in tier-2 at "
                     f"{r.tierfs.total_s:.2f} s")
    return lines


def sustained_writes(directory: Path, mnt: Path, rounds: int, total_bytes: int, client: TierClient,
                     options: dict[str, Any], bucket: str, cpu_of: Callable[[], tuple[float, float]],
                     log: TextIO) -> list[SustainedRound]:
    """``rounds`` sustained write rounds into the tierfs mount ``mnt``, with the minimal
    filesystem mounted beside it (direct_io, its journal file in ``directory``) for the
    ceiling."""
    from benchmarks.fuse_tools import CeilingMount

    ceiling = CeilingMount(directory / "ceiling-mnt", MiB, "direct_io", directory / "ceiling.log",
                           journal_dir=directory)
    try:
        found = []
        for r in range(rounds):
            print(f"[direct_io] round {r + 1}/{rounds}: sustained VD write of {total_bytes // MiB} MiB "
                  "(ceiling, upload bound, tierfs) ...", file=log, flush=True)
            found.append(sustained_round(ceiling.mountpoint / "journal", mnt, f"sustained-{r}", total_bytes,
                                         client, options, bucket, cpu_of))
        return found
    finally:
        ceiling.close()
