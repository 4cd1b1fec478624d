"""fsspec writes (issue 19 item 5), part of ``python -m benchmarks fsspec``: ``tierfs://``
files written in ``wb`` and ``ab`` next to the engine in-process writing the same bytes
with the same append size, in the same run.

Per round (``--write-rounds``, default 3), on the benchmark's daemon and its in-process
store (both PD, the defaults otherwise; their data dirs on the same disk), ``--write-mib``
MiB (default 256) of seeded random bytes:

- (W) ceiling: a new file on the same disk written by ``os.write`` of 8 MiB pieces, each
  followed by ``os.fdatasync``: the disk's pace for durable writes of that size (tierfs
  also writes every byte a second time, into its chunk, meanwhile; its journal file is
  preallocated, this file is not, so (e) may beat (W) on a quick disk);
- (e) engine: ``await store.create(name)``, then ``await store.append(name, piece)`` of
  8 MiB pieces (memoryview slices of the payload; the engine copies each once), in this
  process;
- (wb) fsspec: ``f = fs.open("tierfs://<new name>", "wb")``, ``f.write`` of 1 MiB
  pieces, ``f.close()``, in a thread of this process (``TierFileSystem`` created
  beforehand): the file sends each full 8 MiB buffer as one append on the daemon's
  append socket, pipelined, and ``close`` waits for the last answer;
- (ab) as (wb) with ``ab`` on a segment created beforehand holding 4 KiB.

(W) comes first, then the cases one after the other, their order rotating from round to
round; each is timed from the create or open to the last acknowledgement. Before each,
both stores flush everything to tier-2 and ``sync`` writes every dirty page (untimed), so
no case pays for another's flush or write-back. Recorded per case: the daemon's CPU time
(``/proc/<pid>/stat``), the writing thread's (``time.thread_time``; for (e) the whole
process's), and the block device's busy time and bytes written
(``/sys/dev/block/<major>:<minor>/stat``; every tenant's I/O counts). Each fsspec segment
is then read back through fsspec and its SHA-256 compared with the payload's; then the
round's segments are deleted.

Target: (wb) / (e) and (ab) / (e) >= 0.7, the median of the rounds' own ratios.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
import time
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio
from tierfs.fsspec_impl.filesystem import WRITE_BUFFER_BYTES, TierFileSystem

from benchmarks.common import (
    Check,
    MiB,
    Throughput,
    checks_json,
    format_checks,
    make_payload,
    print_sections,
)
from tierfs import StoreConfig, open_store
from tierfs.contracts import operations as ops
from tierfs.contracts.info import SegmentInfo
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import Daemon, start_daemon

APPEND_BYTES = WRITE_BUFFER_BYTES  # the fsspec file's append size; the engine's too
USER_WRITE_BYTES = MiB  # one f.write
AB_HEAD_BYTES = 4096  # what the ab segment holds before the timed write
TARGET_RATIO = 0.7
STOP_TIMEOUT_S = 60.0  # the daemon flushes before it exits
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CASES = ("e", "wb", "ab")
LABELS = {
    "W": "(W) ceiling: os.write 8 MiB + fdatasync, same disk",
    "e": "(e) engine in-process, await store.append(8 MiB)",
    "wb": "(wb) tierfs:// wb, f.write(1 MiB), 8 MiB appends",
    "ab": "(ab) tierfs:// ab, f.write(1 MiB), 8 MiB appends",
}


@dataclasses.dataclass(frozen=True)
class DiskCounters:
    """The block device's own counters (``/sys/dev/block/<major>:<minor>/stat``)."""

    busy_ms: int  # io_ticks: milliseconds with at least one request in flight
    sectors_written: int  # 512-byte sectors, whatever the device's sector size

    @classmethod
    def read(cls, directory: Path) -> DiskCounters | None:
        """The counters of the device holding ``directory``; None where there are none."""
        device = os.stat(directory).st_dev
        try:
            fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text().split()
        except OSError:
            return None
        return cls(busy_ms=int(fields[9]), sectors_written=int(fields[6]))


def thread_times(schedstat_path: str) -> tuple[float, float] | None:
    """Seconds a thread has run on a CPU and waited runnable for one (its ``schedstat``);
    None where the kernel keeps no such counters."""
    try:
        on_cpu_ns, waiting_ns, _ = Path(schedstat_path).read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclasses.dataclass(frozen=True)
class Counters:
    """What a case is charged with, read at its start and at its end."""

    process_cpu_s: float  # the process that appends (e: this one; wb, ab: the daemon)
    loop: tuple[float, float] | None  # its event loop's thread: on a CPU, waiting for one
    writer: tuple[float, float] | None  # wb, ab: this (the writing) thread
    disk: DiskCounters | None

    @classmethod
    def read(cls, directory: Path, daemon: Daemon | None) -> Counters:
        """For (e) (``daemon`` None: this process, whose event loop runs in this thread)
        or for (wb)/(ab) (the daemon's process and main thread, and this thread)."""
        if daemon is None:
            return cls(time.process_time(), thread_times("/proc/thread-self/schedstat"), None,
                       DiskCounters.read(directory))
        return cls(process_cpu_s(daemon.pid), thread_times(f"/proc/{daemon.pid}/task/{daemon.pid}/schedstat"),
                   thread_times("/proc/thread-self/schedstat"), DiskCounters.read(directory))


def _spent(before: tuple[float, float] | None, after: tuple[float, float] | None) -> tuple[float, float] | None:
    return None if before is None or after is None else (after[0] - before[0], after[1] - before[1])


@dataclasses.dataclass(frozen=True)
class WriteCase:
    throughput: Throughput
    process_cpu_s: float  # the appending process's CPU (e: this process; wb, ab: the daemon)
    loop_s: tuple[float, float] | None  # its event loop: on a CPU, runnable waiting for one
    writer_s: tuple[float, float] | None  # wb, ab: the writing thread, likewise
    disk_busy_s: float | None  # the device had a request in flight (any tenant's)
    disk_written_bytes: int | None  # written to the device meanwhile (any tenant's)

    @classmethod
    def of(cls, throughput: Throughput, before: Counters, after: Counters) -> WriteCase:
        disk_busy_s = written = None
        if before.disk is not None and after.disk is not None:
            disk_busy_s = (after.disk.busy_ms - before.disk.busy_ms) / 1000
            written = (after.disk.sectors_written - before.disk.sectors_written) * 512
        return cls(throughput, after.process_cpu_s - before.process_cpu_s, _spent(before.loop, after.loop),
                   _spent(before.writer, after.writer), disk_busy_s, written)


@dataclasses.dataclass(frozen=True)
class WriteRound:
    order: tuple[str, ...]
    disk: Throughput  # (W)
    cases: dict[str, WriteCase]  # "e", "wb", "ab"

    def ratio(self, case: str) -> float:
        return self.cases[case].throughput.mb_per_s / self.cases["e"].throughput.mb_per_s


@dataclasses.dataclass(frozen=True)
class WriteResults:
    size_bytes: int
    append_bytes: int
    rounds: list[WriteRound]

    def median(self, case: str) -> float:
        return statistics.median(r.cases[case].throughput.mb_per_s for r in self.rounds)

    def median_ratio(self, case: str) -> float:
        return statistics.median(r.ratio(case) for r in self.rounds)


# ----------------------------------------------------------------- measurements
def disk_ceiling(directory: Path, payload: bytes) -> Throughput:
    """(W): the payload written in 8 MiB pieces, each made durable before the next."""
    path = directory / "write-ceiling.bin"
    view = memoryview(payload)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start_s = perf_counter()
        for offset in range(0, len(view), APPEND_BYTES):
            piece = view[offset:offset + APPEND_BYTES]
            while piece:
                piece = piece[os.write(fd, piece):]
            os.fdatasync(fd)
        elapsed_s = perf_counter() - start_s
    finally:
        os.close(fd)
        path.unlink()
    return Throughput.of(LABELS["W"], len(payload), elapsed_s)


async def engine_write(store: SegmentStore, directory: Path, name: str, payload: bytes) -> WriteCase:
    """(e): the payload appended in 8 MiB pieces by this process's store, then checked
    to be durable whole."""
    view = memoryview(payload)
    before = Counters.read(directory, None)
    start_s = perf_counter()
    await store.create(name, make_parents=True)
    for offset in range(0, len(view), APPEND_BYTES):
        await store.append(name, view[offset:offset + APPEND_BYTES])
    elapsed_s = perf_counter() - start_s
    after = Counters.read(directory, None)
    info = await store.stat(name)
    if not isinstance(info, SegmentInfo) or info.durable_length != len(payload):
        raise RuntimeError(f"the engine holds {getattr(info, 'durable_length', None)} of {len(payload)} bytes")
    return WriteCase.of(Throughput.of(LABELS["e"], len(payload), elapsed_s), before, after)


def fsspec_write(fs: TierFileSystem, daemon: Daemon, directory: Path, name: str, mode: str,
                 payload: bytes) -> WriteCase:
    """(wb) or (ab) in this thread, then the segment read back and compared (untimed)."""
    head = b""
    if mode == "ab":
        head = bytes(range(256)) * (AB_HEAD_BYTES // 256)
        fs.pipe_file(name, head)
    view = memoryview(payload)
    before = Counters.read(directory, daemon)
    start_s = perf_counter()
    with fs.open(name, mode) as f:
        for offset in range(0, len(view), USER_WRITE_BYTES):
            f.write(view[offset:offset + USER_WRITE_BYTES])
    elapsed_s = perf_counter() - start_s
    after = Counters.read(directory, daemon)
    digest = hashlib.sha256()
    with fs.open(name, "rb") as f:
        while piece := f.read(4 * MiB):
            digest.update(piece)
    if digest.hexdigest() != hashlib.sha256(head + payload).hexdigest():
        raise RuntimeError(f"tierfs://{name} ({mode}) holds other bytes than were written")
    return WriteCase.of(Throughput.of(LABELS[mode], len(payload), elapsed_s), before, after)


async def settle(store: SegmentStore, fs: TierFileSystem) -> None:
    """Both stores flush everything to tier-2 and every dirty page goes to the disk
    (``sync``), so no write-back of an earlier case competes with the next one."""
    await store.flush()
    await trio.to_thread.run_sync(lambda: fs.client.call(ops.FLUSH))
    await trio.to_thread.run_sync(os.sync)


async def measure_writes(store: SegmentStore, daemon: Daemon, directory: Path, size: int, rounds: int,
                         log: TextIO) -> WriteResults:
    """The write rounds against ``daemon`` and the in-process ``store`` (see the module
    docstring)."""
    payload = make_payload(size, seed=19)
    fs = TierFileSystem(url=daemon.url, skip_instance_cache=True)
    results = []
    try:
        for index in range(rounds):
            order = CASES[index % len(CASES):] + CASES[:index % len(CASES)]
            print(f"write round {index + 1}/{rounds}: {size // MiB} MiB, (W) then {', '.join(order)} ...",
                  file=log, flush=True)
            await settle(store, fs)
            disk = await trio.to_thread.run_sync(disk_ceiling, directory, payload)
            cases: dict[str, WriteCase] = {}
            for case in order:
                await settle(store, fs)
                name = f"bench/write-{case}-{index}"
                if case == "e":
                    cases[case] = await engine_write(store, directory, name, payload)
                else:
                    cases[case] = await trio.to_thread.run_sync(fsspec_write, fs, daemon, directory, name, case,
                                                                payload)
            await store.delete(f"bench/write-e-{index}")
            for case in ("wb", "ab"):
                await trio.to_thread.run_sync(fs.rm_file, f"bench/write-{case}-{index}")
            results.append(WriteRound(order, disk, cases))
    finally:
        fs.client.close()
    return WriteResults(size, APPEND_BYTES, results)


# ---------------------------------------------------------------------- report
def write_checks(w: WriteResults) -> list[Check]:
    return [Check(f"({case}) / (e) tierfs:// {case} vs engine", w.median_ratio(case), TARGET_RATIO, True, "x")
            for case in ("wb", "ab")]


def format_writes(w: WriteResults) -> list[str]:
    header = f"{'write ' + str(w.size_bytes // MiB) + ' MiB (MB/s, median of rounds)':<52} {'MB/s':>8} {'min':>8} {'max':>8}"
    lines = [header, "-" * len(header)]
    rows = [("W", lambda r: r.disk)] + [(case, lambda r, c=case: r.cases[c].throughput) for case in CASES]
    for key, pick in rows:
        values = [pick(r).mb_per_s for r in w.rounds]
        lines.append(f"{LABELS[key]:<52} {statistics.median(values):>8,.1f} {min(values):>8,.1f} {max(values):>8,.1f}")
    lines.append("per round: MB/s -> / (e) [wall; CPU of the appending process, its event loop's thread on a "
                 "CPU and runnable waiting for one, the fsspec writer's; the disk's busy time and writes; seconds]")
    for index, r in enumerate(w.rounds, 1):
        lines.append(f"round {index} ({', '.join(r.order)}): (W) {r.disk.mb_per_s:,.1f}")
        lines.extend(f"  {describe_case(case, r)}" for case in CASES)
    lines.append(f"(e) / (W) median {statistics.median(r.cases['e'].throughput.mb_per_s / r.disk.mb_per_s for r in w.rounds):.3f} "
                 "(the engine against the disk's bound for PD appends of this size)")
    return lines


def describe_case(case: str, r: WriteRound) -> str:
    """One case of a round: throughput, ratio, wall, CPU, waits for a CPU, disk time."""
    c = r.cases[case]
    parts = [f"{c.throughput.seconds:.2f} s", f"{'this process' if case == 'e' else 'daemon'} CPU {c.process_cpu_s:.2f}"]
    if c.loop_s is not None:
        parts.append(f"its loop on CPU {c.loop_s[0]:.2f}, waiting for one {c.loop_s[1]:.2f}")
    if c.writer_s is not None:
        parts.append(f"writer on CPU {c.writer_s[0]:.2f}, waiting {c.writer_s[1]:.2f}")
    if c.disk_busy_s is not None and c.disk_written_bytes is not None:
        parts.append(f"disk busy {c.disk_busy_s:.2f}, {c.disk_written_bytes / MiB:,.0f} MiB")
    ratio = "" if case == "e" else f" -> {r.ratio(case):.3f}"
    return f"({case}) {c.throughput.mb_per_s:,.1f}{ratio} [{'; '.join(parts)}]"


def writes_json(w: WriteResults) -> dict[str, Any]:
    return {
        "results": dataclasses.asdict(w),
        "medians_mb_per_s": {LABELS[case]: w.median(case) for case in CASES},
        "median_ratios": {case: w.median_ratio(case) for case in ("wb", "ab")},
    }


# ------------------------------------------------------------ --writes-only
def run_alone(directory: Path, size: int, rounds: int, log: TextIO) -> WriteResults:
    """The write rounds without the read part: a daemon and an in-process store of
    their own (defaults, PD), in ``directory``."""
    daemon = start_daemon(directory / "daemon", drop_tierfs_env=True, log_path=directory / "daemon.log",
                          verbose=False)
    try:
        async def measure() -> WriteResults:
            async with open_store(StoreConfig(data_dir=directory / "engine")) as store:
                return await measure_writes(store, daemon, directory, size, rounds, log)

        return trio.run(measure)
    finally:
        code, _ = daemon.stop(timeout_s=STOP_TIMEOUT_S)
        if code != 0:
            print(f"the daemon exited with {code}:\n{daemon.stderr_tail()}", file=log)


def print_alone(machine: dict[str, Any], w: WriteResults, checks: list[Check], out: TextIO) -> None:
    fs = machine["filesystem"]
    print(f"fsspec writes: {w.size_bytes / MiB:g} MiB per case, {w.append_bytes // MiB} MiB appends, PD; daemon over "
          f"its Unix sockets; {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']}", file=out)
    print(file=out)
    print_sections([format_writes(w), format_checks(checks)], out)


def alone_json(machine: dict[str, Any], w: WriteResults, checks: list[Check]) -> dict[str, Any]:
    return {"benchmark": "fsspec", "writes_only": True, "machine": machine, "writes": writes_json(w),
            "targets": checks_json(checks)}
