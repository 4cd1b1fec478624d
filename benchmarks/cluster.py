"""Cluster benchmark, metadata part: what a metadata operation costs on PostgreSQL next to
SQLite, and what namespace operations cost as the store grows.

1. **Metadata latency** (``--rounds``, default 300): a ``MetadataStore`` on SQLite in the
   scratch directory (WAL, synchronous=FULL) and one on a durable PostgreSQL started for
   the run on 127.0.0.1 (``tierfs.testing.postgres``, fsync on), interleaved round by
   round (the order alternates: the machine is shared and noisy). Per round and backend:
   ``create_segment`` (a namespace transaction), ``find_segment`` (a stat that misses the
   daemon's memory: one row by name), ``update_segment`` (a conditional record update,
   as a seal or a tier2 append commit), ``commit_flush`` (record + chunk, one
   transaction). The bounds, in the same rounds: a bare ``SELECT 1`` round trip and the
   smallest durable commit (one-row upsert). Reported: p50/p99 in µs, PostgreSQL/SQLite.
2. **Namespace scaling** (SQLite, in-process ``open_store``): two stores are filled
   directly through the metadata (one transaction of bulk inserts, no API calls): a
   small one (``--small`` segments, default 10,000, in one directory) and a large one
   (``--large`` segments, default 1,000,000: ``--large-dir`` = 100,000 of them in one
   directory, the rest in directories of 1,000). Each also has a directory of 10.
   Reported for both: ``open_store`` time and the process's peak RSS after it (the store
   holds the namespace in memory), ``stat`` p50/p99 over 2,000 random names, ``ls`` of
   the 10-entry directory (must not grow with the store) and of the big directory (per
   entry). Ratios large/small show what grows with the store.

3. to 5.: append throughput with 1, 2 and 3 cluster daemons, failover time, tail latency
   across hosts (``benchmarks/cluster_daemons.py``).

A missed expectation is reported, not an error: the exit code is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import EXIT_OK, Latency, add_scratch_arguments, make_scratch_directory
from benchmarks.scale import fill_segments

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


# ---------------------------------------------------------------- 1. metadata latency
def _metadata_ops(meta: Any, round_number: int) -> dict[str, Callable[[], object]]:
    from tierfs.engine.record_types import Chunk, SegmentMeta

    name = f"bench/r{round_number}"
    state: dict[str, Any] = {}

    def create() -> None:
        state["row"] = meta.create_segment(name, "bench", SegmentMeta())

    def find() -> None:
        assert meta.find_segment(name) is not None

    def update() -> None:
        row = state["row"]
        record = dataclasses.replace(row.record, modified_ns=time.time_ns())
        state["rev"] = meta.update_segment(row, record)
        state["row"] = dataclasses.replace(row, rev=state["rev"], record=record)

    def flush() -> None:
        row = state["row"]
        record = dataclasses.replace(row.record, flushed_length=4096)
        chunk = Chunk(name=f"s{row.segment_id}/e1-c0", segment_id=row.segment_id, length=4096)
        meta.commit_flush(row, record, chunk)

    def round_trip() -> None:
        meta.database.execute("SELECT 1").fetchone()

    def smallest_commit() -> None:
        with meta.database.transaction():
            meta.database.execute("INSERT INTO store (key, value) VALUES ('bench', ?) "
                                  "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (b"x",))

    return {"create": create, "stat (row by name)": find, "record update": update,
            "flush commit": flush, "bound: SELECT 1": round_trip, "bound: smallest commit": smallest_commit}


def metadata_latency(directory: Path, rounds: int) -> dict[str, dict[str, Latency]]:
    from tierfs.engine.metadata.store import MetadataStore
    from tierfs.testing.postgres import PostgresServer

    with PostgresServer(durable=True) as server:
        stores = {
            "sqlite": MetadataStore.sqlite(directory / "latency.sqlite"),
            "postgresql": MetadataStore.open(server.create_database("bench"), directory / "unused"),
        }
        for meta in stores.values():
            meta.mkdir("bench", "")
        samples: dict[str, dict[str, list[float]]] = {b: {} for b in stores}
        for round_number in range(rounds):
            order = list(stores) if round_number % 2 == 0 else list(reversed(stores))
            for backend in order:
                for op, call in _metadata_ops(stores[backend], round_number).items():
                    started = time.perf_counter()
                    call()
                    samples[backend].setdefault(op, []).append(time.perf_counter() - started)
        for meta in stores.values():
            meta.close()
    return {backend: {op: Latency.of(values) for op, values in ops.items()} for backend, ops in samples.items()}


# ---------------------------------------------------------------- 2. namespace scaling
async def _namespace_figures(data_dir: Path, names: list[str], big_name: str) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        opened_s = time.perf_counter() - started
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rng = random.Random(8)
        stats = []
        for name in rng.sample(names, min(2000, len(names))):
            t = time.perf_counter()
            await store.stat(name)
            stats.append(time.perf_counter() - t)
        small_ls, big_ls = [], []
        for _ in range(50):
            t = time.perf_counter()
            assert len(await store.list("small")) == 10
            small_ls.append(time.perf_counter() - t)
        for _ in range(3):
            t = time.perf_counter()
            entries = len(await store.list(big_name))
            big_ls.append(time.perf_counter() - t)
    return {"segments": len(names), "open_s": opened_s, "peak_rss_mib": peak_rss_mib, "stat": Latency.of(stats),
            "ls_small": Latency.of(small_ls), "ls_big_entries": entries, "ls_big_s": statistics.median(big_ls)}


def namespace_scaling(directory: Path, small: int, large: int, large_dir: int) -> dict[str, dict[str, Any]]:
    figures = {}
    for label, total, big in (("small", small, small - 10), ("large", large, large_dir)):
        data_dir = directory / f"store-{label}"
        names, _ = fill_segments(data_dir, total, big)  # the scale benchmark's layout
        figures[label] = trio.run(_namespace_figures, data_dir, names, "big")
    return figures


# ---------------------------------------------------------------- report
def run(args: argparse.Namespace) -> int:
    from benchmarks import cluster_daemons
    from tierfs.testing.postgres import PostgresServer

    directory = make_scratch_directory(args.dir)
    try:
        latency = metadata_latency(directory, args.rounds)
        scaling = namespace_scaling(directory, args.small, args.large, args.large_dir)
        with PostgresServer() as server:  # appends never touch the metadata; leases do
            throughput = cluster_daemons.append_throughput(directory, server, args.writers, args.seconds)
            failovers = cluster_daemons.failover_times(directory, server, args.failovers, args.lease)
            tails = cluster_daemons.tail_latencies(directory, server, args.tail_lines)
    finally:
        import shutil
        shutil.rmtree(directory, ignore_errors=True)
    out = sys.stdout
    print(f"metadata latency, {args.rounds} rounds (p50 / p99 µs)", file=out)
    print(f"  {'operation':26} {'SQLite':>17} {'PostgreSQL':>17} {'PG/SQLite p50':>14}", file=out)
    for op, sqlite in latency["sqlite"].items():
        pg = latency["postgresql"][op]
        print(f"  {op:26} {sqlite.p50_us:8.0f} / {sqlite.p99_us:6.0f} {pg.p50_us:8.0f} / {pg.p99_us:6.0f} "
              f"{pg.p50_us / sqlite.p50_us:14.2f}", file=out)
    small, large = scaling["small"], scaling["large"]
    print("namespace scaling (in-process store, SQLite)", file=out)
    for label, f in (("small", small), ("large", large)):
        print(f"  {label}: {f['segments']:,} segments: open {f['open_s']:.1f} s, peak RSS {f['peak_rss_mib']:.0f} MiB, "
              f"stat p50/p99 {f['stat'].p50_us:.1f}/{f['stat'].p99_us:.1f} µs, ls of 10 p50 {f['ls_small'].p50_us:.1f} µs, "
              f"ls of {f['ls_big_entries']:,} {f['ls_big_s'] * 1e3:.0f} ms "
              f"({f['ls_big_s'] / f['ls_big_entries'] * 1e6:.2f} µs/entry)", file=out)
    growth = large["segments"] / small["segments"]
    print(f"  large/small ({growth:.0f}x segments): stat p50 {large['stat'].p50_us / small['stat'].p50_us:.2f}x, "
          f"ls of 10 {large['ls_small'].p50_us / small['ls_small'].p50_us:.2f}x, "
          f"ls per entry {(large['ls_big_s'] / large['ls_big_entries']) / (small['ls_big_s'] / small['ls_big_entries']):.2f}x, "
          f"open {large['open_s'] / small['open_s']:.0f}x", file=out)
    for line in cluster_daemons.report(throughput, failovers, args.lease, args.writers, args.seconds, tails):
        print(line, file=out)
    return EXIT_OK
