"""``GET /metrics``: the store's statistics in the Prometheus text format.

The collector reads ``SegmentStore.statistics()`` at scrape time: nothing is counted
twice and a scrape costs the same whatever the traffic. Every family is unlabelled;
counters get Prometheus' ``_total`` suffix (docs/API.md lists the names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response

from tierfs.contracts.reports.statistics import StoreStatistics
from tierfs.store.datadir.lost_found_files import held_bytes
from tierfs.store.served import ServedStore

CONTENT_TYPE = "text/plain; version=0.0.4"


class StoreCollector:
    """A Prometheus collector reading the store's statistics at scrape time."""

    def __init__(self, store: ServedStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Any]:
        stats = self._store.statistics()
        held, held_size = held_bytes(self._store.config.data_dir)  # a few files: lost+found is for accidents
        counters: dict[str, tuple[str, float]] = {
            "tierfs_appends": ("appends acknowledged", stats.appends),
            "tierfs_appended_bytes": ("bytes appended", stats.appended_bytes),
            "tierfs_journal_syncs": ("journal fdatasync rounds", stats.journal_syncs),
            "tierfs_flushes": ("tier-2 flushes", stats.flushes),
            "tierfs_flushed_bytes": ("bytes flushed to tier-2", stats.flushed_bytes),
            "tierfs_flush_failures": ("failed tier-2 flushes", stats.flush_failures),
            "tierfs_cache_hits": ("block cache hits", stats.cache.hits),
            "tierfs_cache_misses": ("block cache misses", stats.cache.misses),
            "tierfs_cache_evictions": ("block cache evictions", stats.cache.evictions),
            "tierfs_tier2_gets": ("ranged GETs issued to tier-2", stats.cache.gets),
            "tierfs_tier2_fetched_bytes": ("bytes fetched from tier-2", stats.cache.fetched_bytes),
            "tierfs_offloaded_bytes": ("bytes offloaded to the long-term store", stats.offloaded_bytes),
            "tierfs_offloaded_chunks": ("chunks offloaded to the long-term store", stats.offloaded_chunks),
            "tierfs_offload_failures": ("failed offload jobs", stats.offload_failures),
            "tierfs_hot_copies_deleted": ("chunk-store copies deleted after offload", stats.hot_copies_deleted),
            "tierfs_retention_deleted_bytes": ("bytes deleted by retention", stats.retention_deleted_bytes),
            "tierfs_lost_found_bytes": ("acknowledged bytes saved to lost+found once fenced",
                                        self._store.fence.lost_found_bytes),
            "tierfs_metadata_backups": ("metadata backups uploaded to tier-2", stats.metadata_backups),
            "tierfs_metadata_backup_failures": ("failed metadata backup cycles", stats.metadata_backup_failures),
        }
        gauges: dict[str, tuple[str, float]] = {
            "tierfs_segments": ("segments", stats.segments),
            "tierfs_journal_bytes": ("bytes in journal files", stats.journal_bytes),
            "tierfs_journal_files": ("journal files", stats.journal_files),
            "tierfs_flush_backlog_bytes": ("durable bytes not yet in tier-2", stats.unflushed_bytes),
            "tierfs_flush_lag_seconds": ("age of the oldest unflushed append", stats.flush_lag_s),
            "tierfs_tail_memory_bytes": ("unflushed bytes held in memory", stats.tail_memory_bytes),
            "tierfs_cache_bytes": ("bytes in the block cache", stats.cache.used_bytes),
            "tierfs_epoch": ("owner epoch of the data directory", stats.epoch),
            "tierfs_fenced": ("1 once another owner claimed tier-2", int(self._store.fence.fenced)),
            "tierfs_lost_found_entries": ("entries held in lost+found (tierfs lost-found list)", held),
            "tierfs_lost_found_held_bytes": ("bytes held in lost+found", held_size),
            "tierfs_offload_oldest_waiting_seconds": (
                "age of the oldest sealed chunk a policy wants offloaded", stats.offload_oldest_waiting_s),
        }
        for family_type, table in ((CounterMetricFamily, counters), (GaugeMetricFamily, gauges)):
            for name, (text, value) in table.items():
                family = family_type(name, text)
                family.add_metric([], value)
                yield family
        yield from _per_container(self._store.container_statistics())


# cluster mode: the figures an operator compares between containers, one sample per
# container held here (label ``container="c003"``); the unlabelled ones are their sums
_PER_CONTAINER: dict[str, tuple[str, bool, Callable[[StoreStatistics], float]]] = {
    "tierfs_container_appends": ("appends acknowledged", True, lambda s: s.appends),
    "tierfs_container_appended_bytes": ("bytes appended", True, lambda s: s.appended_bytes),
    "tierfs_container_flushed_bytes": ("bytes flushed to tier-2", True, lambda s: s.flushed_bytes),
    "tierfs_container_flush_failures": ("failed tier-2 flushes", True, lambda s: s.flush_failures),
    "tierfs_container_segments": ("segments", False, lambda s: s.segments),
    "tierfs_container_flush_backlog_bytes": ("durable bytes not yet in tier-2", False, lambda s: s.unflushed_bytes),
    "tierfs_container_flush_lag_seconds": ("age of the oldest unflushed append", False, lambda s: s.flush_lag_s),
    "tierfs_container_journal_bytes": ("bytes in journal files", False, lambda s: s.journal_bytes),
    "tierfs_container_epoch": ("owner epoch of the container's store", False, lambda s: s.epoch),
}


def _per_container(parts: dict[str, StoreStatistics]) -> Iterator[Any]:
    if not parts:
        return
    for name, (text, counter, figure) in _PER_CONTAINER.items():
        family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, text, labels=["container"])
        for container, stats in parts.items():
            family.add_metric([container], figure(stats))
        yield family


class MetricsRoute:
    def __init__(self, store: ServedStore) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(StoreCollector(store))

    async def get(self, request: Request) -> Response:
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE)
