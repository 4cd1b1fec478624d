"""A cold sequential read of a segment in a fresh process (``read``, ``offload``): it
opens the store the request describes (empty block cache), sets its S3 client up with
one untimed HEAD, reads the segment in 1 MiB reads through one reader, and answers the
scan's seconds and CPU, the cache's counters, its peak RSS, and what one cold 4 KiB read
at a random offset fetches afterwards (the cache emptied first).

Why a process per scan, started before the parent allocates anything: Linux carries
ru_maxrss across exec (a child started early inherits only a small peak), and a closed
store sits in reference cycles until collected (a second scan would start with the first
one's cache resident).
"""

from __future__ import annotations

import dataclasses
import random
import resource
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import procfs
from benchmarks.harness.child import JsonLineChild, serve
from benchmarks.harness.figures import Throughput
from benchmarks.harness.stores import sequential_scan
from tierfs import StoreConfig, open_store

RANDOM_READ_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class ColdScan:
    throughput: Throughput
    cache: dict[str, int]  # BlockCache.statistics() after the scan
    cache_budget_bytes: int
    peak_rss_bytes: int  # ru_maxrss right after the scan
    scan_cpu_s: float  # all the child's threads during the scan
    scan_system_cpu_s: float
    scan_minor_faults: int  # pages faulted in during the scan (the cache's fresh memory)
    random_read_gets: int
    random_read_fetched_bytes: int


def spec(config: Any, name: str, size: int, **settings: Any) -> dict[str, Any]:
    """A request: the store (``config``'s data dir and tier-2, and ``settings``), the segment, its size."""
    return {"data_dir": str(config.data_dir), "segment": name, "size": size,
            "config": {"tier2_url": config.tier2_url, "tier2_options": dict(config.tier2_options), **settings}}


async def set_up_client(store: Any, name: str) -> float:
    """One HEAD of the first chunk (tier-2, or the long-term store): the client set up, cache untouched."""
    start_s = perf_counter()
    first = (await store.chunk_layout(name))[0]
    long_term = store.offloader.long_term
    if first["offloaded"] and long_term is not None:
        await trio.to_thread.run_sync(long_term.stat, long_term.key_of(first["url"]))
    else:
        await trio.to_thread.run_sync(store.chunk_storage.stat, first["name"])
    return perf_counter() - start_s


async def cold_scan(request: dict[str, Any]) -> ColdScan:
    config = StoreConfig(data_dir=Path(request["data_dir"]), **request["config"])
    name, size = request["segment"], request["size"]
    async with open_store(config) as store:
        setup_s = await set_up_client(store, name)
        cpu_before_s, usage_before = procfs.self_cpu_s(), resource.getrusage(resource.RUSAGE_SELF)
        seconds, _ = await sequential_scan(store, name, size)
        cpu_s, usage = procfs.self_cpu_s() - cpu_before_s, resource.getrusage(resource.RUSAGE_SELF)
        await trio.sleep(0.05)  # read-ahead past the end, if any, is counted too
        cache = dataclasses.asdict(store.block_cache.statistics())
        # one 4 KiB read at a random aligned offset (not 0: a fresh reader at 0 counts as sequential)
        store.block_cache.clear()
        before = store.block_cache.statistics()
        offset = random.Random(3).randrange(1, max(2, size // RANDOM_READ_BYTES)) * RANDOM_READ_BYTES
        await store.open_reader(name).read(offset, RANDOM_READ_BYTES)
        await trio.sleep(0.05)  # any read-ahead it started shows now
        after = store.block_cache.statistics()
    return ColdScan(Throughput("tierfs cold sequential read, 1 MiB reads", size, seconds, setup_s), cache,
                    config.block_cache_bytes, usage.ru_maxrss * 1024, cpu_s, usage.ru_stime - usage_before.ru_stime,
                    usage.ru_minflt - usage_before.ru_minflt, after.gets - before.gets,
                    after.fetched_bytes - before.fetched_bytes)


class ColdScanChild(JsonLineChild):
    """One scan's process (see the module docstring); start it before allocating much."""

    def __init__(self, log_path: Path) -> None:
        super().__init__("benchmarks.harness.cold_scan", log_path=log_path)

    def run(self, request: dict[str, Any]) -> ColdScan:
        figures = self.request(request)
        return ColdScan(**{**figures, "throughput": Throughput(**figures["throughput"])})


if __name__ == "__main__":
    sys.exit(serve(lambda request: dataclasses.asdict(trio.run(cold_scan, request))))
