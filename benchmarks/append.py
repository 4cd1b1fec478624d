"""Append benchmark: tierfs 1 KiB appends next to the raw ceilings of the same disk.

Each measurement runs ``--seconds`` after a short warm-up (only operations started inside
the window count), each ceiling right before the tierfs cases compared with it. Ceilings,
``os`` calls on a file opened as the journal opens its files: (a) write 1 KiB +
fdatasync, the floor of one durable append; (b) write 32 KiB + fdatasync, what group
commit of 32 writers can reach; (c) write 1 KiB, no sync, all a VD append needs. tierfs:
``store.append`` on a fresh store, default configuration (its background flush on the
same disk included): PD 1 writer, PD 32 tasks on their own segments, VD 1 writer, each
task one append in flight. Targets (issue 2): PD 32 >= 0.5 x (b)'s records/s; PD 1 p50
<= 3 x (a)'s; VD 1 >= 0.25 x (c)'s rate.

Also: records per journal sync, flushes, the fdatasync path, and the CPU bound: the
measuring thread's (tierfs: the event loop's, which runs every append) share of the
window on a CPU and waiting for one (``schedstat``) and its CPU per record; a rate cannot
exceed one append per that CPU, the bound printed beside PD 32 and VD 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import procfs
from benchmarks.harness.figures import Check, percentile
from benchmarks.harness.scenario import Report, UsageError, table
from tierfs import StoreConfig, open_store

HELP = "1 KiB appends (PD/VD, 1 and 32 writers) vs raw write/fdatasync ceilings"
RECORD_BYTES = 1024
WRITERS = 32
MAX_WARMUP_S = 0.5
# ceiling: (label, records per write, fdatasync), then the tierfs case compared with it: (durability, writers)
CASES = {"a": ("raw (a) write 1 KiB + fdatasync", 1, True, "pd", 1),
         "b": ("raw (b) write 32 KiB + fdatasync", WRITERS, True, "pd", WRITERS),
         "c": ("raw (c) write 1 KiB, no sync", 1, False, "vd", 1)}


@dataclasses.dataclass
class Window:
    """The measured window; keeps the latencies of operations started inside it."""

    measure_from_s: float
    stop_at_s: float
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    last_end_s: float = 0.0
    cpu_at_open: tuple[float, float] | None = None  # the thread's schedstat as the window opened

    def record(self, start_s: float, end_s: float) -> None:
        if start_s >= self.measure_from_s:
            self.latencies_s.append(end_s - start_s)
            self.last_end_s = max(self.last_end_s, end_s)

    def summary(self, label: str, records_per_operation: int = 1, **figures: Any) -> Measurement:
        ordered, end = sorted(self.latencies_s), procfs.thread_times()
        on_cpu = [e - s for e, s in zip(end, self.cpu_at_open, strict=True)] if end and self.cpu_at_open else [None] * 2
        return Measurement(label, len(ordered) * records_per_operation, self.last_end_s - self.measure_from_s,
                           percentile(ordered, 0.5) * 1e6, percentile(ordered, 0.99) * 1e6, *on_cpu, **figures)


@dataclasses.dataclass
class Measurement:
    label: str
    records: int
    elapsed_s: float
    p50_us: float
    p99_us: float
    on_cpu_s: float | None = None  # the measuring thread (tierfs: the event loop)
    waiting_s: float | None = None  # runnable, waiting for a CPU
    syncs: int | None = None
    sync_busy_s: float | None = None  # time an fdatasync (tierfs: a journal round) was in flight
    flushes: int | None = None
    sync_backend: str | None = None

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def cpu_us_per_record(self) -> float | None:
        return self.on_cpu_s / self.records * 1e6 if self.on_cpu_s is not None and self.records else None


def measure_raw(key: str, path: Path, warmup_s: float, duration_s: float) -> Measurement:
    label, records, sync, _, _ = CASES[key]
    buffer, sync_s = b"r" * (RECORD_BYTES * records), 0.0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        start_s = perf_counter()
        window = Window(start_s + warmup_s, start_s + warmup_s + duration_s)
        while start_s < window.stop_at_s:
            if window.cpu_at_open is None and start_s >= window.measure_from_s:
                window.cpu_at_open = procfs.thread_times()
            view = memoryview(buffer)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                synced_s = perf_counter()
                os.fdatasync(fd)
                sync_s += perf_counter() - synced_s if synced_s >= window.measure_from_s else 0.0
            end_s = perf_counter()
            window.record(start_s, end_s)
            start_s = end_s
        found = window.summary(label, records, **({"syncs": len(window.latencies_s), "sync_busy_s": sync_s}
                                                  if sync else {}))
        os.fdatasync(fd)  # untimed: what (c) left dirty is written now, not during the next measurement
    finally:
        os.close(fd)
    path.unlink()
    return found


async def measure_store(durability: str, writers: int, data_dir: Path, warmup_s: float,
                        duration_s: float) -> Measurement:
    segments = [f"bench/seg{i}" for i in range(writers)]
    label = f"tierfs {durability.upper()} {writers} writer{'s' if writers > 1 else ''}"
    payload = b"t" * RECORD_BYTES
    async with open_store(StoreConfig(data_dir=data_dir, durability=durability)) as store:
        for segment in segments:
            await store.create(segment, durability=durability, make_parents=True)
        start = perf_counter()
        window = Window(start + warmup_s, start + warmup_s + duration_s)

        async def loop(segment: str) -> None:
            start_s = perf_counter()
            while start_s < window.stop_at_s:
                await store.append(segment, payload)
                end_s = perf_counter()
                window.record(start_s, end_s)
                start_s = end_s

        async with trio.open_nursery() as nursery:
            for segment in segments:
                nursery.start_soon(loop, segment)
            await trio.sleep(max(0.0, window.measure_from_s - perf_counter()))
            before, busy_before_s = store.statistics(), store.journal.sync_busy_s
            window.cpu_at_open = procfs.thread_times()
        after = store.statistics()
        return window.summary(label, syncs=after.journal_syncs - before.journal_syncs,
                              sync_busy_s=store.journal.sync_busy_s - busy_before_s,
                              flushes=after.flushes - before.flushes, sync_backend=store.journal.sync_backend)


def report(duration_s: float, m: dict[str, Measurement]) -> Report:
    def share(value: float | None, of: float | None, spec: str) -> str:
        return "-" if value is None or not of or math.isnan(value / of) else format(value / of, spec)

    rows = [[x.label, f"{x.records_per_s:,.0f}", x.p50_us, x.p99_us, share(x.records, x.syncs, ",.1f"),
             share(x.sync_busy_s and x.sync_busy_s * 1e6, x.syncs, ",.0f"), share(x.sync_busy_s, x.elapsed_s, ".0%"),
             "-" if x.flushes is None else f"{x.flushes:,}", share(x.on_cpu_s, x.elapsed_s, ".0%"),
             share(x.waiting_s, x.elapsed_s, ".0%"), share(x.cpu_us_per_record, 1, ".1f")] for x in m.values()]
    backends = sorted({x.sync_backend for x in m.values() if x.sync_backend})
    legend = [f"{duration_s:g} s per measurement; latencies per operation (raw (b): per 32 KiB write + fdatasync); "
              f"journal fdatasyncs through: {', '.join(backends) or '-'}; sync us / disk: mean fdatasync (tierfs: "
              "journal round) / share of the window one was in flight; flushes: to tier-2 in the window; on CPU / "
              "waits: shares of the window the measuring thread (tierfs: its event loop) ran / was runnable and "
              "waited; CPU us: its CPU per record"]
    bounds = [f"bound: {m[case].label} with its event loop on a CPU all the time ({loop_us:.1f} us per append): "
              f"{1e6 / loop_us / m[ceiling].records_per_s:.3f} x {m[ceiling].label}"
              for case, ceiling in ((f"pd{WRITERS}", "b"), ("vd1", "c")) if (loop_us := m[case].cpu_us_per_record)]
    checks = [Check(f"PD {WRITERS} writers appends/s / raw (b) records/s",
                    m[f"pd{WRITERS}"].records_per_s / m["b"].records_per_s, 0.50, True, "x"),
              Check("PD 1 writer p50 / raw (a) p50", m["pd1"].p50_us / m["a"].p50_us, 3.0, False, "x"),
              Check("VD 1 writer appends/s / raw (c) writes/s", m["vd1"].records_per_s / m["c"].records_per_s,
                    0.25, True, "x")]
    header = ["measurement", "records/s", "p50 us", "p99 us", "records/sync", "sync us", "disk", "flushes",
              "on CPU", "waits", "CPU us"]
    return Report(f"append benchmark: {RECORD_BYTES}-byte records", [legend, table(header, rows), bounds], checks,
                  {"seconds_per_measurement": duration_s,
                   "measurements": {k: {**dataclasses.asdict(x), "records_per_s": x.records_per_s} for k, x in m.items()}})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement (default 3)")


def measure(directory: Path, args: argparse.Namespace) -> Report:
    if not args.seconds > 0:
        raise UsageError("--seconds must be > 0")
    warmup_s, found = min(MAX_WARMUP_S, 0.2 * args.seconds), {}
    for key, (_, _, _, durability, writers) in CASES.items():
        found[key] = measure_raw(key, directory / key, warmup_s, args.seconds)
        found[f"{durability}{writers}"] = trio.run(measure_store, durability, writers,
                                                   directory / f"{durability}{writers}", warmup_s, args.seconds)
    return report(args.seconds, found)
