"""Timing for the append benchmark (``benchmarks.append``): the measured window, the
measuring thread's CPU from the scheduler's accounting, and one measurement's figures.

Invariants: only operations started inside the window count; CPU shares are of the
window's wall time.
"""

from __future__ import annotations

import dataclasses
import math
import time
from time import perf_counter

from benchmarks.common import percentile


@dataclasses.dataclass
class Window:
    """The measured window; collects latencies of operations started inside it."""

    measure_from_s: float
    stop_at_s: float
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    last_end_s: float = 0.0

    @classmethod
    def after_warmup(cls, warmup_s: float, duration_s: float) -> Window:
        measure_from_s = perf_counter() + warmup_s
        return cls(measure_from_s, measure_from_s + duration_s)

    def is_open(self, now_s: float) -> bool:
        return now_s < self.stop_at_s

    def record(self, start_s: float, end_s: float) -> None:
        if start_s >= self.measure_from_s:
            self.latencies_s.append(end_s - start_s)
            self.last_end_s = max(self.last_end_s, end_s)

    @property
    def elapsed_s(self) -> float:
        return self.last_end_s - self.measure_from_s


def thread_cpu_s() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of the calling thread
    so far, from the scheduler's own accounting (``/proc/thread-self/schedstat``)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            on_cpu_ns, waiting_ns, _ = stats.read().split()
    except (OSError, ValueError):
        return time.thread_time(), math.nan
    return int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9


@dataclasses.dataclass(frozen=True)
class Measurement:
    label: str
    operations: int
    records: int  # 1 KiB records written by those operations
    elapsed_s: float
    records_per_s: float
    p50_latency_us: float  # per operation
    p99_latency_us: float
    records_per_sync: float | None  # None where nothing was synced in the window
    # tierfs only: tier-2 flushes in the window and the backlog left at its end
    tier2_flushes: int | None = None
    unflushed_bytes_at_end: int | None = None
    journal_sync: str | None = None  # how the journal ran its fdatasyncs: "aio" or "thread"
    # Shares of the window the measuring thread (tierfs: the event loop) spent on a CPU,
    # and runnable but waiting for one (other tenants of the machine): the CPU bound.
    on_cpu_share: float | None = None
    cpu_wait_share: float | None = None
    # tierfs: share of the window a journal fdatasync was in flight, and its mean time
    # (raw (a)/(b): every operation's fdatasync), so the disk's part of the bound
    sync_busy_share: float | None = None
    sync_mean_us: float | None = None

    @property
    def cpu_us_per_record(self) -> float | None:
        """The measuring thread's CPU per record (tierfs: its event loop's)."""
        if self.on_cpu_share is None or not self.records:
            return None
        return self.on_cpu_share * self.elapsed_s / self.records * 1e6


def with_cpu_shares(
    measurement: Measurement, start: tuple[float, float], end: tuple[float, float], elapsed_s: float
) -> Measurement:
    """``measurement`` with the thread's CPU shares between two ``thread_cpu_s``."""
    if elapsed_s <= 0:
        return measurement
    return dataclasses.replace(
        measurement,
        on_cpu_share=(end[0] - start[0]) / elapsed_s,
        cpu_wait_share=(end[1] - start[1]) / elapsed_s,
    )


def summarize(
    label: str, window: Window, *, records_per_operation: int = 1, syncs: int | None = None
) -> Measurement:
    latencies_s = sorted(window.latencies_s)
    operations = len(latencies_s)
    records = operations * records_per_operation
    elapsed_s = window.elapsed_s
    return Measurement(
        label=label,
        operations=operations,
        records=records,
        elapsed_s=elapsed_s,
        records_per_s=records / elapsed_s if elapsed_s > 0 else math.nan,
        p50_latency_us=percentile(latencies_s, 0.50) * 1e6,
        p99_latency_us=percentile(latencies_s, 0.99) * 1e6,
        records_per_sync=records / syncs if syncs else None,
    )
