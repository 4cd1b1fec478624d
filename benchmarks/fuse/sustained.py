"""The FUSE benchmark's sustained VD write (issue 19, item 7): what a writer keeps up
through a tierfs mount once the flush backlog is full, the upload to tier-2 included,
next to one ``write(2)`` per request to the same disk.

A short ``dd`` burst lands in the journal and returns before much is uploaded. A writer
that keeps writing fills the backlog (``max_backlog_bytes``); from then on the mount
refuses appends (ENOSPC, "retry later") until flushes make room, so what it sustains is
bounded by the upload. Per round, seconds apart:

- the ceiling: 1 MiB ``os.write`` requests of zeros into the minimal filesystem's
  ``journal`` file (one ``write(2)`` each to a file on the data disk, what tierfs's VD
  does before it acknowledges);
- the upload bound: s3fs ``pipe_file`` of ``max_flush_bytes`` (16 MiB) objects, one
  after another, as the storage writer flushes a segment;
- tierfs: the same writer into a new segment of the mount, a refused request retried
  after 10 ms, timed until ``client.op("flush")`` returns (every byte in tier-2).

Invariant: a refused request wrote nothing (tierfs checks the backlog before the journal
write), so each byte is written once; the flushed length is checked. Every run starts
after an untimed ``sync(2)``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable
from pathlib import Path
from time import perf_counter, sleep
from typing import Any

from benchmarks.harness import procfs, s3
from benchmarks.harness.figures import MiB, Throughput

REQUEST_BYTES = MiB  # one FUSE write per request under direct_io, as dd bs=1M
# While requests are refused the backlog is full, so the wait costs the upload nothing;
# each refusal is a round trip the daemon answers on the CPUs the upload needs: 10 ms.
REFUSAL_WAIT_S = 0.01
UPLOAD_BOUND_BYTES = 256 * MiB


@dataclasses.dataclass(frozen=True)
class SustainedWrite:
    nbytes: int
    write_s: float  # first write to the close of the file
    total_s: float  # to every byte in tier-2 (the flush's return); write_s for the ceiling
    refusals: int
    bytes_before_refusal: int
    first_refusal_s: float | None

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.total_s / 1e6


@dataclasses.dataclass(frozen=True)
class SustainedRound:
    ceiling: SustainedWrite
    upload: Throughput
    upload_server_cpu_s: float
    tierfs: SustainedWrite
    daemon_cpu_s: float  # during the tierfs write and flush
    server_cpu_s: float

    @property
    def ratio(self) -> float:
        return self.tierfs.mb_per_s / self.ceiling.mb_per_s


def write_requests(path: Path, total_bytes: int, after: Callable[[], object] | None = None) -> SustainedWrite:
    """``total_bytes`` of zeros into ``path``, one ``os.write`` per request, retried on
    ENOSPC, the file closed, then ``after()``: the clock runs until it returns."""
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


def upload_bound(options: dict[str, Any], object_bytes: int) -> Throughput:
    """s3fs ``pipe_file`` of ``object_bytes`` objects one after another, then deleted."""
    fs, setup_s = s3.new_s3fs(options, s3.BUCKET)
    data, count = bytes(object_bytes), max(1, UPLOAD_BOUND_BYTES // object_bytes)
    start_s = perf_counter()
    for index in range(count):
        fs.pipe_file(f"{s3.BUCKET}/upload-bound/{index}", data)
    seconds = perf_counter() - start_s
    fs.rm(f"{s3.BUCKET}/upload-bound", recursive=True)
    return Throughput(f"s3fs pipe_file, {object_bytes // MiB} MiB objects", count * object_bytes, seconds, setup_s)


def sustained_round(ceiling_file: Path, mount: Any, name: str, total_bytes: int, endpoint: s3.S3Endpoint
                    ) -> SustainedRound:
    """The ceiling, the upload bound and tierfs, one after another; the segment deleted after."""
    from tierfs import SegmentInfo, StoreConfig

    ceiling = write_requests(ceiling_file, total_bytes)
    server_before = procfs.cpu_s(endpoint.pid)
    upload = upload_bound(endpoint.storage_options(), StoreConfig().max_flush_bytes)
    upload_server_cpu_s = procfs.cpu_s(endpoint.pid) - server_before
    client = mount.client()
    try:
        daemon_before, server_before = procfs.cpu_s(mount.pid), procfs.cpu_s(endpoint.pid)
        tierfs = write_requests(mount.path(name), total_bytes, lambda: client.op("flush", path=name))
        daemon_s, server_s = procfs.cpu_s(mount.pid) - daemon_before, procfs.cpu_s(endpoint.pid) - server_before
        info = client.stat(name)
        if not isinstance(info, SegmentInfo) or info.flushed_length != total_bytes:
            raise RuntimeError(f"{name}: {info} after writing and flushing {total_bytes} bytes")
        client.delete(name)
    finally:
        client.close()
    return SustainedRound(ceiling, upload, upload_server_cpu_s, tierfs, daemon_s, server_s)


def format_sustained(rounds: list[SustainedRound]) -> list[str]:
    lines = ["sustained VD write, direct_io, MB/s: ceiling, upload bound, tierfs, until the backlog was full; "
             "refusals; tierfs/ceiling, tierfs/upload; CPU ms per MiB"]
    for index, r in enumerate(rounds, 1):
        t, mib = r.tierfs, r.tierfs.nbytes / MiB
        burst = (t.bytes_before_refusal / (t.first_refusal_s or t.write_s)) / 1e6
        lines.append(f"round {index} ({mib:,.0f} MiB): {r.ceiling.mb_per_s:,.1f}, {r.upload.mb_per_s:,.1f}, "
                     f"{t.mb_per_s:,.1f}, {burst:,.1f}; {t.refusals}; {r.ratio:.3f}, "
                     f"{t.mb_per_s / r.upload.mb_per_s:.3f}; daemon {r.daemon_cpu_s * 1e3 / mib:.2f}, s3rver "
                     f"{r.server_cpu_s * 1e3 / mib:.2f}, upload bound's s3rver "
                     f"{r.upload_server_cpu_s * 1e3 / (r.upload.nbytes / MiB):.2f}")
        lines.append(f"  tierfs: backlog full after {t.bytes_before_refusal / MiB:,.0f} MiB"
                     + (f" ({t.first_refusal_s:.2f} s)" if t.first_refusal_s is not None else " (never)")
                     + f", last write returned at {t.write_s:.2f} s, all in tier-2 at {t.total_s:.2f} s")
    return lines
