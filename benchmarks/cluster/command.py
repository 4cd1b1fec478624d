"""Cluster benchmark: what a metadata operation costs on PostgreSQL next to SQLite, what
namespace operations cost as the store grows, and real cluster daemons (``daemons.py``).

1. Metadata latency (``--rounds``, 300): a ``MetadataStore`` on SQLite (WAL,
   synchronous=FULL) and one on a durable PostgreSQL started for the run on 127.0.0.1
   (fsync on), interleaved round by round, the order alternating: ``create_segment``,
   ``find_segment`` (a stat that misses the daemon's memory), ``update_segment`` (a seal
   or a tier2 append commit), ``commit_flush`` (record + chunk, one transaction); beside
   them the bounds, a bare ``SELECT 1`` and the smallest durable commit (a one-row upsert).
2. Namespace scaling (SQLite, in-process ``open_store``): a small store (``--small``
   segments) and a large one (``--large``, ``--large-dir`` of them in one directory),
   filled straight through the metadata: ``open_store`` time and peak RSS, ``stat`` of
   2,000 random names, ``ls`` of a 10-entry directory (must not grow with the store) and
   of the big directory (per entry), and the ratios large/small.
3. to 5.: ``daemons.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import random
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.cluster import daemons
from benchmarks.harness.figures import Latency
from benchmarks.harness.scenario import Report, add_scratch_arguments, run_scenario, table
from benchmarks.harness.stores import fill_segments

HELP = ("metadata latency on PostgreSQL vs SQLite, ls/stat as the namespace grows, append throughput "
        "with 1-3 cluster daemons, failover time")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser, "the SQLite files and the PostgreSQL data")
    parser.add_argument("--rounds", type=int, default=300, help="metadata latency rounds")
    parser.add_argument("--small", type=int, default=10_000, help="segments in the small store")
    parser.add_argument("--large", type=int, default=1_000_000, help="segments in the large store")
    parser.add_argument("--large-dir", type=int, default=100_000, help="segments in the large store's big directory")
    parser.add_argument("--writers", type=int, default=2, help="appending client processes per daemon")
    parser.add_argument("--seconds", type=float, default=5.0, help="append throughput: seconds per configuration")
    parser.add_argument("--failovers", type=int, default=20, help="failover runs")
    parser.add_argument("--lease", type=float, default=10.0, help="lease_s of the failover runs")
    parser.add_argument("--tail-lines", type=int, default=500, help="lines followed across hosts")


def metadata_ops(meta: Any, round_number: int) -> dict[str, Callable[[], object]]:
    from tierfs.engine.record_types import Chunk, SegmentMeta

    name, state = f"bench/r{round_number}", {}

    def create() -> None:
        state["row"] = meta.create_segment(name, "bench", SegmentMeta())

    def update() -> None:
        row = state["row"]
        record = dataclasses.replace(row.record, modified_ns=time.time_ns())
        state["row"] = dataclasses.replace(row, rev=meta.update_segment(row, record), record=record)

    def flush() -> None:
        row = state["row"]
        meta.commit_flush(row, dataclasses.replace(row.record, flushed_length=4096),
                          Chunk(name=f"s{row.segment_id}/e1-c0", segment_id=row.segment_id, length=4096))

    def smallest_commit() -> None:
        with meta.database.transaction():
            meta.database.execute("INSERT INTO store (key, value) VALUES ('bench', ?) "
                                  "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (b"x",))

    return {"create": create, "stat (row by name)": lambda: meta.find_segment(name), "record update": update,
            "flush commit": flush, "bound: SELECT 1": lambda: meta.database.execute("SELECT 1").fetchone(),
            "bound: smallest commit": smallest_commit}


def metadata_latency(directory: Path, rounds: int) -> dict[str, dict[str, Latency]]:
    from tierfs.engine.metadata.store import MetadataStore
    from tierfs.testing.postgres import PostgresServer

    with PostgresServer(durable=True) as server:
        stores = {"sqlite": MetadataStore.sqlite(directory / "latency.sqlite"),
                  "postgresql": MetadataStore.open(server.create_database("bench"), directory / "unused")}
        samples: dict[str, dict[str, list[float]]] = {backend: {} for backend in stores}
        for meta in stores.values():
            meta.mkdir("bench", "")
        for round_number in range(rounds):
            for backend in list(stores) if round_number % 2 == 0 else list(reversed(stores)):
                for op, call in metadata_ops(stores[backend], round_number).items():
                    started = time.perf_counter()
                    call()
                    samples[backend].setdefault(op, []).append(time.perf_counter() - started)
        for meta in stores.values():
            meta.close()
    return {backend: {op: Latency.of(values) for op, values in ops.items()} for backend, ops in samples.items()}


async def namespace_figures(data_dir: Path, names: list[str]) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        opened_s = time.perf_counter() - started
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        async def timed(call: Callable[[], Any], times: int) -> list[float]:
            found = []
            for _ in range(times):
                t = time.perf_counter()
                await call()
                found.append(time.perf_counter() - t)
            return found

        stats = []
        for name in random.Random(8).sample(names, min(2000, len(names))):
            stats += await timed(functools.partial(store.stat, name), 1)
        small_ls = await timed(lambda: store.list("small"), 50)
        entries = len(await store.list("big"))
        big_ls = await timed(lambda: store.list("big"), 3)
    return {"segments": len(names), "open_s": opened_s, "peak_rss_mib": peak_rss_mib, "stat": Latency.of(stats),
            "ls_small": Latency.of(small_ls), "ls_big_entries": entries, "ls_big_s": statistics.median(big_ls)}


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs.testing.postgres import PostgresServer

    latency = metadata_latency(directory, args.rounds)
    scaling = {}
    for label, total, big in (("small", args.small, args.small - 10), ("large", args.large, args.large_dir)):
        names = fill_segments(directory / f"store-{label}", total, big)
        scaling[label] = trio.run(namespace_figures, directory / f"store-{label}", names)
    with PostgresServer() as server:  # appends never touch the metadata; leases do
        throughput = daemons.append_throughput(directory, server, args.writers, args.seconds)
        failovers = daemons.failover_times(directory, server, args.failovers, args.lease)
        tails = daemons.tail_latencies(directory, server, args.tail_lines)
    rows = [[op, f"{s.p50_us:.0f} / {s.p99_us:.0f}", f"{pg.p50_us:.0f} / {pg.p99_us:.0f}", f"{pg.p50_us / s.p50_us:.2f}"]
            for op, s in latency["sqlite"].items() for pg in [latency["postgresql"][op]]]
    small, large = scaling["small"], scaling["large"]
    lines = ["namespace scaling (in-process store, SQLite)"]
    for label, f in scaling.items():
        lines.append(f"  {label}: {f['segments']:,} segments: open {f['open_s']:.1f} s, peak RSS {f['peak_rss_mib']:.0f} "
                     f"MiB, stat p50/p99 {f['stat'].p50_us:.1f}/{f['stat'].p99_us:.1f} µs, ls of 10 p50 "
                     f"{f['ls_small'].p50_us:.1f} µs, ls of {f['ls_big_entries']:,} {f['ls_big_s'] * 1e3:.0f} ms "
                     f"({f['ls_big_s'] / f['ls_big_entries'] * 1e6:.2f} µs/entry)")
    per_entry = (large["ls_big_s"] / large["ls_big_entries"]) / (small["ls_big_s"] / small["ls_big_entries"])
    lines.append(f"  large/small ({large['segments'] / small['segments']:.0f}x segments): stat p50 "
                 f"{large['stat'].p50_us / small['stat'].p50_us:.2f}x, ls of 10 "
                 f"{large['ls_small'].p50_us / small['ls_small'].p50_us:.2f}x, ls per entry {per_entry:.2f}x, open "
                 f"{large['open_s'] / small['open_s']:.0f}x")
    sections = [table([f"metadata latency, {args.rounds} rounds (p50 / p99 µs)", "SQLite", "PostgreSQL",
                       "PG/SQLite p50"], rows), lines,
                daemons.report(throughput, failovers, args.lease, args.writers, args.seconds, tails)]
    return Report("cluster benchmark", sections, [], {"metadata_latency": latency, "namespace": scaling,
                                                      "append_throughput": throughput, "failovers_s": failovers,
                                                      "tail_latencies_s": tails})


def run(args: argparse.Namespace) -> int:
    return run_scenario("cluster", args, lambda directory: measure(directory, args))
