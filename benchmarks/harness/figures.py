"""Figures every benchmark reports: throughput, latency percentiles, targets, and the
seeded bytes they are measured on.

Invariant: a target (``Check``) over several rounds is judged on the median of the
rounds' own values (each round's two figures are measured seconds apart, so they share
the machine's load) and reports the worst round beside it: a target must hold in every
run, and the worst of the rounds says whether it did.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

MiB = 1 << 20


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(1, math.ceil(fraction * len(sorted_values))) - 1]


@dataclasses.dataclass(frozen=True)
class Throughput:
    label: str
    nbytes: int
    seconds: float
    setup_s: float = 0.0  # untimed: e.g. the first request that sets up an S3 client

    @property
    def mb_per_s(self) -> float:  # 10^6 bytes per second
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else math.nan


@dataclasses.dataclass(frozen=True)
class Latency:
    samples: int
    p50_us: float
    p99_us: float
    max_us: float

    @classmethod
    def of(cls, latencies_s: Sequence[float]) -> Latency:
        ordered = sorted(latencies_s)
        return cls(len(ordered), percentile(ordered, 0.50) * 1e6, percentile(ordered, 0.99) * 1e6,
                   (ordered[-1] if ordered else math.nan) * 1e6)

    def text(self) -> str:
        return f"p50 {self.p50_us:,.1f} us, p99 {self.p99_us:,.1f} us, max {self.max_us:,.1f} us"


@dataclasses.dataclass(frozen=True)
class Check:
    """One target: ``value`` against ``limit`` (``worst``: the worst round's value)."""

    name: str
    value: float
    limit: float
    at_least: bool  # True: value must be >= limit; False: <= limit
    unit: str = ""
    worst: float | None = None

    @classmethod
    def over(cls, name: str, values: Sequence[float], limit: float, at_least: bool, unit: str = "x") -> Check:
        """The median of the rounds' ``values``, with the worst of them."""
        worst = min(values) if at_least else max(values)
        return cls(name, statistics.median(values), limit, at_least, unit, worst if len(values) > 1 else None)

    @property
    def passed(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def text(self, width: int) -> str:
        worst = "" if self.worst is None else f"  worst round {self.worst:.3f}"
        return (f"{self.name:<{width}} {self.value:9.3f} {self.unit:<3} ({'>=' if self.at_least else '<='} "
                f"{self.limit:g}) {'PASS' if self.passed else 'FAIL'}{worst}")

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


def ratios(ours: Sequence[Throughput], theirs: Sequence[Throughput]) -> list[float]:
    """Each round's ``ours`` / ``theirs`` in MB/s."""
    return [a.mb_per_s / b.mb_per_s for a, b in zip(ours, theirs, strict=True)]


def make_payload(size: int, seed: int) -> bytes:
    """Seeded random bytes (made 1 MiB at a time: randbytes is limited to < 2 GiBit)."""
    rng = random.Random(seed)
    return b"".join(rng.randbytes(min(MiB, size - offset)) for offset in range(0, size, MiB))
