"""One ``StoreStatistics`` for a cluster daemon: the sum over the container stores it
holds (ages and the epoch: the largest), for ``/metrics`` and the benchmarks.

Invariant: reads counters only (as ``collect_statistics``); no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tierfs.contracts.reports.statistics import CacheStatistics, StoreStatistics

_LARGEST = {"epoch", "flush_lag_s", "offload_oldest_waiting_s"}


def summed_statistics(parts: Sequence[StoreStatistics]) -> StoreStatistics:
    values: dict[str, object] = {}
    for field in dataclasses.fields(StoreStatistics):
        if field.name == "cache":
            values["cache"] = CacheStatistics(**{
                f.name: sum(getattr(p.cache, f.name) for p in parts) for f in dataclasses.fields(CacheStatistics)})
        elif field.name == "recovery":
            values["recovery"] = None
        elif field.name in _LARGEST:
            values[field.name] = max((getattr(p, field.name) for p in parts), default=0)
        else:
            values[field.name] = sum(getattr(p, field.name) for p in parts)
    return StoreStatistics(**values)  # type: ignore[arg-type]
