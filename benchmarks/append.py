"""Append benchmark: tierfs 1 KiB appends next to the raw ceilings of the same disk.

Everything runs in one process, in one run, in a fresh directory on one filesystem
(under ``--dir``, default the current directory; RAM-backed filesystems are refused
because fdatasync costs nothing there). Each measurement runs for ``--seconds`` after a
short warm-up; only operations started inside that window count, and each one is timed
with ``time.perf_counter``. Each ceiling runs right before the tierfs cases compared
with it, so the two figures of a ratio are measured seconds apart.

tierfs (``await store.append(segment, 1 KiB)`` is what is timed), a fresh store with the
default configuration per case, so the background flush to tier-2 (``<data_dir>/chunks``
on the same disk) is part of what is measured:

- PD (returns after the group-commit fdatasync covering the record) and VD (returns
  after write(2));
- 1 writer; 32 concurrent trio tasks, each appending to its own segment; 32 tasks
  sharing one segment. Every task keeps one append in flight (closed loop).

Raw ceilings, plain ``os`` calls on one thread, on a file opened as the journal opens
its files (``O_APPEND``, growing, not preallocated):

- (a) write 1 KiB + fdatasync per record: the latency floor of one durable append;
- (b) write 32 KiB + fdatasync: 32 records per sync, the throughput ceiling of group
  commit with 32 writers (each has one record in flight, so one sync can carry at
  most 32 of them);
- (c) write 1 KiB, no sync: copying a record into the page cache, all a VD append has
  to do (its file is synced after the window, untimed, so its dirty pages do not slow
  the next measurement).

Why these are the right comparisons: a PD append cannot return before its bytes are
written and synced, so (a) bounds its latency and (b) bounds what group commit of 32
writers can reach; a VD append cannot be cheaper than the write(2) that carries it, so
(c) bounds it. Whatever tierfs spends beyond them is engine overhead (framing, CRC,
bookkeeping, task scheduling, the worker-thread hop of fdatasync, the background flush
to tier-2), which is what the ratios expose. Disks differ by orders of magnitude and
the machine is shared and noisy, so absolute figures say little; ratios to ceilings
measured seconds apart on the same disk are what the targets (issue 2) are set on:

- PD, 32 writers on their own segments: appends/s >= 50 % of (b)'s record rate;
- PD, 1 writer: p50 latency <= 3 x (a)'s p50;
- VD, 1 writer: appends/s >= 25 % of (c)'s rate.

The report also gives records per journal sync (group-commit batch size), the number of
tier-2 flushes in each window, how the journal ran its fdatasyncs (native AIO, or its
sync thread where AIO is missing or ``TIERFS_JOURNAL_AIO=0``), and the CPU bound: the
shares of the window the measuring thread (for tierfs, the event loop, which runs every
append) spent on a CPU and runnable but waiting for one (the scheduler's accounting in
``/proc/thread-self/schedstat``; other tenants of a shared machine show up there) and
its CPU time per record. Every append runs on the event loop, so the PD 32 and VD 1
targets cannot exceed one append per the loop's CPU time per append: that bound is
printed beside them, against the same ceiling. A missed target is reported, not an
error: the exit code is 0 either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio

from benchmarks.append_timing import (
    Measurement,
    Window,
    summarize,
    thread_cpu_s,
    with_cpu_shares,
)
from benchmarks.common import (
    EXIT_USAGE,
    Check,
    add_scratch_arguments,
    checks_json,
    format_checks,
    run_in_scratch,
)
from tierfs import StoreConfig, open_store
from tierfs.store.facade import SegmentStore

HELP = "1 KiB appends (PD/VD, 1 and 32 writers) vs raw write/fdatasync ceilings"

RECORD_BYTES = 1024
WRITERS = 32
BATCH_RECORDS = 32  # records per fdatasync in ceiling (b): one per concurrent writer
MAX_WARMUP_S = 0.5
WARMUP_FRACTION = 0.2  # warm-up is this share of --seconds, at most MAX_WARMUP_S


# ----------------------------------------------------------------- raw ceilings
@dataclasses.dataclass(frozen=True)
class RawCase:
    key: str
    label: str
    records_per_write: int
    sync: bool  # fdatasync after every write


RAW_CASES = (
    RawCase("raw_write_fdatasync", "raw (a) write 1 KiB + fdatasync", 1, sync=True),
    RawCase(
        "raw_batched_fdatasync",
        f"raw (b) write {BATCH_RECORDS} KiB + fdatasync",
        BATCH_RECORDS,
        sync=True,
    ),
    RawCase("raw_write", "raw (c) write 1 KiB, no sync", 1, sync=False),
)


def time_loop(operation: Callable[[], None], window: Window) -> tuple[Window, tuple[float, float]]:
    """Run ``operation`` until the window closes; also returns the thread's CPU clock
    (``thread_cpu_s``) as the window opened."""
    start_s = perf_counter()
    at_open: tuple[float, float] | None = None
    while window.is_open(start_s):
        if at_open is None and start_s >= window.measure_from_s:
            at_open = thread_cpu_s()
        operation()
        end_s = perf_counter()
        window.record(start_s, end_s)
        start_s = end_s
    return window, at_open or thread_cpu_s()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextmanager
def journal_like_file(path: Path) -> Iterator[int]:
    """A new file opened the way the journal opens its files."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)


def measure_raw(case: RawCase, path: Path, warmup_s: float, duration_s: float) -> Measurement:
    """Records/s counts 1 KiB records; latencies are per write (+ fdatasync)."""
    buffer = b"r" * (RECORD_BYTES * case.records_per_write)
    syncs_s: list[tuple[float, float]] = []  # (start, duration) of each fdatasync
    with journal_like_file(path) as fd:

        def operation() -> None:
            write_all(fd, buffer)
            if case.sync:
                start_s = perf_counter()
                os.fdatasync(fd)
                syncs_s.append((start_s, perf_counter() - start_s))

        window, cpu_at_open = time_loop(operation, Window.after_warmup(warmup_s, duration_s))
        cpu_at_close = thread_cpu_s()
        # Untimed: write back what (c) left dirty now, not during the next measurement.
        os.fdatasync(fd)
    syncs = len(window.latencies_s) if case.sync else None
    measurement = summarize(
        case.label, window, records_per_operation=case.records_per_write, syncs=syncs
    )
    in_window = [took_s for start_s, took_s in syncs_s if start_s >= window.measure_from_s]
    if in_window and window.elapsed_s > 0:
        measurement = dataclasses.replace(
            measurement,
            sync_busy_share=sum(in_window) / window.elapsed_s,
            sync_mean_us=sum(in_window) / len(in_window) * 1e6,
        )
    return with_cpu_shares(measurement, cpu_at_open, cpu_at_close, window.elapsed_s)


# ----------------------------------------------------------------------- tierfs
@dataclasses.dataclass(frozen=True)
class StoreCase:
    key: str
    label: str
    durability: str
    writers: int
    shared_segment: bool
    ceiling: str  # key of the RawCase this case is compared with (and run right after)

    def segment_names(self) -> list[str]:
        if self.shared_segment:
            return ["bench/shared"] * self.writers
        return [f"bench/seg{index}" for index in range(self.writers)]


def _store_case(durability: str, writers: int, shared: bool, ceiling: str) -> StoreCase:
    if writers == 1:
        suffix, detail = "1_writer", "1 writer"
    else:
        suffix = f"{writers}_writers" + ("_shared" if shared else "")
        detail = f"{writers} writers, " + ("1 segment" if shared else "own segments")
    return StoreCase(
        key=f"tierfs_{durability}_{suffix}",
        label=f"tierfs {durability.upper()} {detail}",
        durability=durability,
        writers=writers,
        shared_segment=shared,
        ceiling=ceiling,
    )


STORE_CASES = (
    _store_case("pd", 1, False, ceiling="raw_write_fdatasync"),
    _store_case("pd", WRITERS, False, ceiling="raw_batched_fdatasync"),
    _store_case("pd", WRITERS, True, ceiling="raw_batched_fdatasync"),
    _store_case("vd", 1, False, ceiling="raw_write"),
    _store_case("vd", WRITERS, False, ceiling="raw_write"),
    _store_case("vd", WRITERS, True, ceiling="raw_write"),
)


async def append_loop(store: SegmentStore, segment: str, payload: bytes, window: Window) -> None:
    start_s = perf_counter()
    while window.is_open(start_s):
        await store.append(segment, payload)
        end_s = perf_counter()
        window.record(start_s, end_s)
        start_s = end_s


async def measure_store(
    case: StoreCase, data_dir: Path, warmup_s: float, duration_s: float
) -> Measurement:
    """A fresh store; ``case.writers`` tasks append 1 KiB records in a closed loop."""
    payload = b"t" * RECORD_BYTES
    segments = case.segment_names()
    config = StoreConfig(data_dir=data_dir, durability=case.durability)
    async with open_store(config) as store:
        for segment in dict.fromkeys(segments):
            await store.create(segment, durability=case.durability, make_parents=True)
        window = Window.after_warmup(warmup_s, duration_s)
        async with trio.open_nursery() as nursery:
            for segment in segments:
                nursery.start_soon(append_loop, store, segment, payload, window)
            await trio.sleep(max(0.0, window.measure_from_s - perf_counter()))
            before = store.statistics()
            journal_sync = store.journal.sync_backend
            busy_before_s = store.journal.sync_busy_s
            cpu_at_open = thread_cpu_s()
        cpu_at_close = thread_cpu_s()
        after = store.statistics()
        busy_s = store.journal.sync_busy_s - busy_before_s
    measurement = summarize(case.label, window, syncs=after.journal_syncs - before.journal_syncs)
    measurement = dataclasses.replace(
        measurement,
        tier2_flushes=after.flushes - before.flushes,
        unflushed_bytes_at_end=after.unflushed_bytes,
        journal_sync=journal_sync,
    )
    rounds = after.journal_syncs - before.journal_syncs
    if rounds and window.elapsed_s > 0:
        measurement = dataclasses.replace(
            measurement,
            sync_busy_share=busy_s / window.elapsed_s,
            sync_mean_us=busy_s / rounds * 1e6,
        )
    return with_cpu_shares(measurement, cpu_at_open, cpu_at_close, window.elapsed_s)


# ------------------------------------------------------------------------ run
def run_order() -> list[RawCase | StoreCase]:
    """Each ceiling right before the tierfs cases compared with it, so a ratio's two
    figures are measured seconds apart even when the disk's speed drifts."""
    order: list[RawCase | StoreCase] = []
    for raw_case in RAW_CASES:
        order.append(raw_case)
        order.extend(case for case in STORE_CASES if case.ceiling == raw_case.key)
    return order


def measure(
    case: RawCase | StoreCase, path: Path, warmup_s: float, duration_s: float
) -> Measurement:
    if isinstance(case, RawCase):
        return measure_raw(case, path, warmup_s, duration_s)
    return trio.run(measure_store, case, path, warmup_s, duration_s)


def run_all(directory: Path, duration_s: float) -> dict[str, Measurement]:
    """Every measurement, in ``directory``; returned ceilings first, then tierfs."""
    warmup_s = min(MAX_WARMUP_S, WARMUP_FRACTION * duration_s)
    results: dict[str, Measurement] = {}
    for case in run_order():
        path = directory / case.key
        results[case.key] = measure(case, path, warmup_s, duration_s)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return {case.key: results[case.key] for case in (*RAW_CASES, *STORE_CASES)}


# --------------------------------------------------------------------- targets
def evaluate_targets(results: dict[str, Measurement]) -> list[Check]:
    pd_many = results[f"tierfs_pd_{WRITERS}_writers"]
    pd_one = results["tierfs_pd_1_writer"]
    vd_one = results["tierfs_vd_1_writer"]
    return [
        Check(
            f"PD {WRITERS} writers appends/s / raw (b) records/s",
            pd_many.records_per_s / results["raw_batched_fdatasync"].records_per_s,
            0.50,
            at_least=True,
        ),
        Check(
            "PD 1 writer p50 / raw (a) p50",
            pd_one.p50_latency_us / results["raw_write_fdatasync"].p50_latency_us,
            3.0,
            at_least=False,
        ),
        Check(
            "VD 1 writer appends/s / raw (c) writes/s",
            vd_one.records_per_s / results["raw_write"].records_per_s,
            0.25,
            at_least=True,
        ),
    ]


@dataclasses.dataclass(frozen=True)
class LoopBound:
    """What a CPU-bound target could reach with its event loop on a CPU all the time:
    one append per ``loop_us_per_append``, against the same ceiling as the target."""

    case: str
    loop_us_per_append: float
    ceiling: str
    ratio: float


def loop_bounds(results: dict[str, Measurement]) -> list[LoopBound]:
    """The bound of each rate target whose appends all run on the event loop."""
    bounds: list[LoopBound] = []
    for case_key, ceiling_key in (
        (f"tierfs_pd_{WRITERS}_writers", "raw_batched_fdatasync"),
        ("tierfs_vd_1_writer", "raw_write"),
    ):
        loop_us = results[case_key].cpu_us_per_record
        ceiling = results[ceiling_key]
        if loop_us:
            bounds.append(LoopBound(
                results[case_key].label, loop_us, ceiling.label, 1e6 / loop_us / ceiling.records_per_s
            ))
    return bounds


# ---------------------------------------------------------------------- report
def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: dict[str, Measurement]) -> list[str]:
    header = (
        f"{'measurement':<38} {'records/s':>10} {'p50 us':>8} {'p99 us':>9} "
        f"{'records/sync':>12} {'sync us':>7} {'disk':>5} {'flushes':>7} {'on CPU':>6} {'waits':>6}"
        f" {'CPU us':>6}"
    )
    lines = [header, "-" * len(header)]
    for m in results.values():
        lines.append(
            f"{m.label:<38} {m.records_per_s:>10,.0f} {m.p50_latency_us:>8,.1f} "
            f"{m.p99_latency_us:>9,.1f} {_optional(m.records_per_sync, ',.1f'):>12} "
            f"{_optional(m.sync_mean_us, ',.0f'):>7} {_optional(m.sync_busy_share, '.0%'):>5} "
            f"{_optional(m.tier2_flushes, ','):>7} {_optional(m.on_cpu_share, '.0%'):>6} "
            f"{_optional(m.cpu_wait_share, '.0%'):>6} {_optional(m.cpu_us_per_record, '.1f'):>6}"
        )
    return lines


def print_report(
    machine: dict[str, Any],
    duration_s: float,
    results: dict[str, Measurement],
    targets: list[Check],
    out: TextIO,
) -> None:
    fs = machine["filesystem"]
    print(
        f"append benchmark: {RECORD_BYTES}-byte records, {machine['cpus']} CPUs, "
        f"{fs['fs_type']} on {fs['device']} ({machine['directory']})",
        file=out,
    )
    backends = sorted({m.journal_sync for m in results.values() if m.journal_sync})
    print(
        f"{duration_s:g} s per measurement; latencies are per operation (raw (b): per "
        f"{BATCH_RECORDS} KiB write + fdatasync);\nflushes: tier-2 flushes in the window; "
        f"journal fdatasyncs through: {', '.join(backends) or '-'};\nsync us / disk: mean "
        f"fdatasync (tierfs: journal round) time / share of the window one was in flight;\n"
        f"on CPU / waits: shares "
        f"of the window the measuring thread (tierfs: its event loop) ran on a CPU / was "
        f"runnable but waited for one;\nCPU us: its CPU time per record",
        file=out,
    )
    print(file=out)
    for line in format_table(results):
        print(line, file=out)
    print(file=out)
    for line in format_checks(targets, name_width=46):
        print(line, file=out)
    print(file=out)
    for bound in loop_bounds(results):
        print(
            f"bound: {bound.case} with its event loop on a CPU all the time "
            f"({bound.loop_us_per_append:.1f} us per append): {bound.ratio:.3f} x {bound.ceiling}",
            file=out,
        )


def report_json(
    machine: dict[str, Any],
    duration_s: float,
    results: dict[str, Measurement],
    targets: list[Check],
) -> dict[str, Any]:
    return {
        "benchmark": "append",
        "record_bytes": RECORD_BYTES,
        "seconds_per_measurement": duration_s,
        "machine": machine,
        "measurements": {key: dataclasses.asdict(m) for key, m in results.items()},
        "targets": checks_json(targets),
        "loop_bounds": [dataclasses.asdict(bound) for bound in loop_bounds(results)],
    }


# ------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="duration of each measurement (default 3)"
    )
    add_scratch_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0:
        print("--seconds must be > 0", file=sys.stderr)
        return EXIT_USAGE
    seconds = args.seconds
    return run_in_scratch(
        "append", args.dir, args.json,
        lambda directory: run_all(directory, seconds),
        evaluate_targets,
        lambda machine, results, targets, out: print_report(machine, seconds, results, targets, out),
        lambda machine, results, targets: report_json(machine, seconds, results, targets),
    )
