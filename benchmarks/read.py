"""Read benchmark: tierfs reads from an S3 tier-2 (s3rver on 127.0.0.1) next to raw s3fs
ceilings on the same server, seconds apart.

A store whose tier-2 is ``s3://tierfs-bench/chunks`` gets a segment of ``--size-mib``
(256) MiB by 1 MiB PD appends, flushed (4-16 MiB objects). Each of ``--rounds`` (5)
rounds measures, with the CPU s3rver and the client spent on each: (b) s3fs ``cat_file``
of each object in turn; (c) s3fs 1 MiB ranges, 16 in flight (tierfs's block size and
tier-2 concurrency); the bound, s3fs with the GET size and concurrency of tierfs's
read-ahead; (a) a cold sequential read in a fresh process (``harness.cold_scan``: empty
256 MiB cache, 1 MiB reads) with (f) its GETs and bytes fetched, (g) its peak RSS and (j)
what one cold random 4 KiB read fetches; (i) the fsspec direct read (``DirectChunkReader``
with the daemon's layout, what ``TierFileSystem.cat_file`` does) and (k) its ceiling, the
whole objects in parallel, joined (the two take turns going first and run once untimed
before the rounds, so neither pays for growing this process's heap).

Then once: (d) the warm re-read, best of 10, taking turns with its ceiling (the same
1 MiB blocks from a dict, no copy, one trio checkpoint per read, as tierfs's reader
yields once per read); (e) random 4 KiB warm reads; (h) the wake-up of a task in
``wait_for_data`` from the call of a PD append (its fdatasync included).

Targets (issue 3, 19), medians of the rounds' ratios: (a) >= 1.0 x (b) and >= 0.70 x
(c); (i) >= 1.0 x (b); GETs <= bytes / 1 MiB, no byte fetched twice; (j) one GET of
1 MiB; peak RSS <= cache budget + 150 MiB; wake-up p99 <= 20 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import s3
from benchmarks.harness.cold_scan import ColdScan, ColdScanChild, spec
from benchmarks.harness.figures import (
    Check,
    Latency,
    MiB,
    Throughput,
    make_payload,
    ratios,
    spread,
    warm_cache_bytes,
)
from benchmarks.harness.scenario import (
    Report,
    add_size_rounds_arguments,
    at_least_one,
    run_scenario,
    table,
)
from benchmarks.harness.stores import random_reads, sequential_scan, write_segment

HELP = "cold/warm segment reads from S3 (s3rver) vs raw s3fs ceilings; RSS; tail wake-up"
SEGMENT, WAKE_SEGMENT = "bench/read", "bench/tail"
CEILING_IN_FLIGHT = 16  # (c): the default tier2_concurrency
WARM_PASSES = 10
RSS_SLACK_BYTES = 150 * MiB
WAKE_RECORD_BYTES, WAKE_INTERVAL_S, WAKE_TIMEOUT_S = 1024, 0.005, 1.0
ROWS = {"a": "(a) tierfs cold sequential read, 1 MiB reads", "i": "(i) fsspec direct read, whole segment",
        "b": "(b) s3fs cat_file, whole objects one by one", "c": "(c) s3fs cat_ranges, 1 MiB, 16 in flight",
        "bound": "bound: s3fs cat_ranges, read-ahead's GETs", "k": "(k) s3fs whole objects in parallel, joined"}


@dataclasses.dataclass
class Round:
    figures: dict[str, Throughput]  # by key of ROWS
    cpu: dict[str, s3.CpuUse]
    cold: ColdScan
    direct_gets: int


def direct_read(options: dict[str, Any], layout: s3.Layout, expected: bytes) -> tuple[Throughput, int]:
    """(i), with its client set up by one untimed HEAD as the ceilings' are; (figure, GETs)."""
    from tierfs.blocks.filesystems import open_filesystem
    from tierfs.remote.direct_read import (
        RUN_BLOCKS,
        RUNS_IN_FLIGHT,
        DirectChunkReader,
        SegmentLayout,
    )

    fs, path = open_filesystem(layout[0]["url"], options)  # the instance the reader gets
    start_s = perf_counter()
    fs.info(path)
    setup_s = perf_counter() - start_s
    segment, reader = SegmentLayout.from_json(layout), DirectChunkReader(dict(options))
    start_s = perf_counter()
    data = reader.read(segment, 0, segment.flushed_end)
    seconds = perf_counter() - start_s
    if data != expected:
        raise RuntimeError("the direct read returned other bytes than were appended")
    label = f"fsspec direct read (runs of {RUN_BLOCKS} MiB, {RUNS_IN_FLIGHT} in flight)"
    return Throughput(label, len(data), seconds, setup_s), reader.gets


def joined_ceiling(options: dict[str, Any], layout: s3.Layout, client: tuple[Any, float] | None = None
                   ) -> Throughput:
    """(k): every object whole, (i)'s concurrency, joined."""
    from tierfs.remote.direct_read import RUNS_IN_FLIGHT

    whole = max(chunk["end"] - chunk["start"] for chunk in layout)
    return s3.cat_ranges_ceiling(options, layout, whole, RUNS_IN_FLIGHT, joined=True, client=client)


def measure_round(endpoint: s3.S3Endpoint, layout: s3.Layout, request: dict[str, Any], child: ColdScanChild,
                  payload: bytes, index: int) -> Round:
    options, pid = endpoint.storage_options(), endpoint.pid
    figures, cpu = {}, {}

    def client() -> tuple[Any, float]:  # set up outside the CPU measurement, as (a)'s is
        return s3.new_s3fs(options, layout[0]["url"])

    ceilings: dict[str, Callable[[tuple[Any, float]], Throughput]] = {
        "b": lambda made: s3.cat_file_ceiling(options, layout, made),
        "c": lambda made: s3.cat_ranges_ceiling(options, layout, MiB, CEILING_IN_FLIGHT, client=made),
        "bound": lambda made: s3.readahead_ceiling(options, layout, made)}
    for key, ceiling in ceilings.items():
        figures[key], cpu[key] = s3.measured(pid, functools.partial(ceiling, client()))
    cold, cpu["a"] = s3.measured(pid, lambda: child.run(request), lambda scan: scan.scan_cpu_s)
    figures["a"] = cold.throughput
    gets = 0
    for key in ("i", "k") if index % 2 else ("k", "i"):
        if key == "i":
            (figures["i"], gets), cpu["i"] = s3.measured(pid, lambda: direct_read(options, layout, payload))
        else:
            figures["k"], cpu["k"] = s3.measured(pid, functools.partial(joined_ceiling, options, layout, client()))
    return Round(figures, cpu, cold, gets)


class MemoryLookup:
    """(d)'s ceiling: the segment's 1 MiB blocks as ``bytes`` in a dict, each handed back
    without a copy after one trio checkpoint (built untimed)."""

    def __init__(self, payload: bytes) -> None:
        self.size = len(payload)
        self.blocks = {offset: payload[offset : offset + MiB] for offset in range(0, self.size, MiB)}

    async def read(self, offset: int) -> bytes:
        block = self.blocks[offset]
        await trio.lowlevel.checkpoint()
        return block

    async def scan_s(self) -> float:
        start_s, total = perf_counter(), 0
        for offset in range(0, self.size, MiB):
            total += len(await self.read(offset))
        if total != self.size:
            raise RuntimeError(f"the ceiling handed out {total} of {self.size} bytes")
        return perf_counter() - start_s


async def warm_reads(config: Any, payload: bytes, random_count: int) -> dict[str, Any]:
    from tierfs import open_store

    size = len(payload)
    async with open_store(config) as store:
        await sequential_scan(store, SEGMENT, size, expected=payload)  # untimed: fills the cache, checks the bytes
        lookup, misses = MemoryLookup(payload), store.block_cache.misses
        tierfs_s = ceiling_s = math.inf
        for index in range(WARM_PASSES):  # taking turns: a pass takes milliseconds
            if index % 2 == 0:
                ceiling_s = min(ceiling_s, await lookup.scan_s())
            tierfs_s = min(tierfs_s, (await sequential_scan(store, SEGMENT, size))[0])
            if index % 2:
                ceiling_s = min(ceiling_s, await lookup.scan_s())
        return {"tierfs": Throughput(f"(d) tierfs warm re-read, best of {WARM_PASSES}", size, tierfs_s),
                "ceiling": Throughput(f"(d) ceiling: cached blocks, no copy, best of {WARM_PASSES}", size, ceiling_s),
                "misses": store.block_cache.misses - misses, "cache_bytes": config.block_cache_bytes,
                "random": await random_reads(store, SEGMENT, size, random_count)}


async def wake_latency(config: Any, samples: int) -> tuple[Latency, Latency, int]:
    """(h): (from the append's call, from its return, appends never seen)."""
    from tierfs import open_store

    started_s, returned_s, woke_s = [0.0] * samples, [0.0] * samples, [math.nan] * samples

    async def waiter(store: Any) -> None:
        seen = 0
        while seen < samples * WAKE_RECORD_BYTES:
            length = await store.wait_for_data(WAKE_SEGMENT, seen, WAKE_TIMEOUT_S)
            now_s = perf_counter()
            for index in range(seen // WAKE_RECORD_BYTES, length // WAKE_RECORD_BYTES):
                woke_s[index] = now_s
            seen = max(seen, length)

    async with open_store(config) as store:
        await store.create(WAKE_SEGMENT, make_parents=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, store)
            await trio.sleep(0.05)  # the waiter is parked before the first append
            for index in range(samples):
                started_s[index] = perf_counter()
                await store.append(WAKE_SEGMENT, b"w" * WAKE_RECORD_BYTES)
                returned_s[index] = perf_counter()
                await trio.sleep(WAKE_INTERVAL_S)
            with trio.move_on_after(WAKE_TIMEOUT_S):
                while math.isnan(woke_s[-1]):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    seen = [i for i in range(samples) if not math.isnan(woke_s[i])]
    return (Latency.of([woke_s[i] - started_s[i] for i in seen]), Latency.of([woke_s[i] - returned_s[i] for i in seen]),
            samples - len(seen))


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs import StoreConfig

    at_least_one(args, "size_mib", "rounds", "random_reads", "wake_samples")
    size, log = args.size_mib * MiB, sys.stderr
    children = [ColdScanChild(directory / f"cold-scan-{i}.log") for i in range(args.rounds)]  # before anything big
    try:
        with s3.s3_server(directory / "s3rver", log) as endpoint:
            options = endpoint.storage_options()

            def config(name: str) -> StoreConfig:
                return StoreConfig(data_dir=directory / name, tier2_url=f"s3://{s3.BUCKET}/{name}", tier2_options=options)

            payload = make_payload(size, 3)
            print(f"s3rver at {endpoint.url}; writing {args.size_mib} MiB ...", file=log, flush=True)
            layout = trio.run(lambda: _write(config("chunks"), payload))
            direct_read(options, layout, payload)  # untimed, see the module docstring
            joined_ceiling(options, layout)
            rounds = []
            for index, child in enumerate(children, 1):
                print(f"round {index}/{args.rounds}: (b), (c), bound, (a), (i), (k) ...", file=log, flush=True)
                rounds.append(measure_round(endpoint, layout, spec(config("chunks"), SEGMENT, size), child, payload,
                                            index))
            print("(d), (e), (h) ...", file=log, flush=True)
            warm = trio.run(warm_reads, config("chunks").replace(block_cache_bytes=warm_cache_bytes(size)), payload,
                            args.random_reads)
            wake = trio.run(wake_latency, config("wake"), args.wake_samples)
    finally:
        for child in children:
            child.close()
    return report(size, len(layout), rounds, warm, wake)


async def _write(config: Any, payload: bytes) -> s3.Layout:
    from tierfs import open_store

    async with open_store(config) as store:
        return await write_segment(store, SEGMENT, payload)


def report(size: int, objects: int, rounds: list[Round], warm: dict[str, Any],
           wake: tuple[Latency, Latency, int]) -> Report:
    def column(key: str) -> list[Throughput]:
        return [r.figures[key] for r in rounds]

    rows = [[label, *spread(column(key))] for key, label in ROWS.items()]
    rows += [[t.label, t.mb_per_s, "-", "-"] for t in (warm["tierfs"], warm["ceiling"])]
    per_round = []
    for index, r in enumerate(rounds, 1):
        f = r.figures
        per_round.append(f"round {index}: " + ", ".join(f"({k}) {f[k].mb_per_s:,.1f}" for k in ROWS) + " MB/s; "
                         f"(a)/(b) {f['a'].mb_per_s / f['b'].mb_per_s:.3f}, (a)/(c) {f['a'].mb_per_s / f['c'].mb_per_s:.3f},"
                         f" (i)/(b) {f['i'].mb_per_s / f['b'].mb_per_s:.3f}, (i)/(k) {f['i'].mb_per_s / f['k'].mb_per_s:.3f},"
                         f" bound/(b) {f['bound'].mb_per_s / f['b'].mb_per_s:.3f}")
        per_round.append("  CPU s, s3rver/client: " + "; ".join(f"{k} {u.server_s:.2f}/{u.client_s:.2f}"
                                                                 for k, u in r.cpu.items())
                         + f"; GETs (a) {r.cold.cache['gets']} (i) {r.direct_gets}; (a) in the kernel "
                         f"{r.cold.scan_system_cpu_s:.2f} s, {r.cold.scan_minor_faults:,} minor faults")
    cold = [r.cold for r in rounds]
    worst = max(cold, key=lambda c: c.peak_rss_bytes)
    start, returned, missed = wake
    details = [
        f"(d) warm cache {warm['cache_bytes'] / MiB:,.0f} MiB, misses in the timed scans {warm['misses']}; tierfs / "
        f"ceiling {warm['tierfs'].mb_per_s / warm['ceiling'].mb_per_s:.3f}",
        f"(e) random 4 KiB reads, warm cache: {warm['random'].text()}",
        f"(f) GETs per cold scan: {', '.join(str(c.cache['gets']) for c in cold)} (bytes / 1 MiB = {size // MiB}); "
        f"last: {cold[-1].reads} reads, fetched {cold[-1].cache['fetched_bytes'] / MiB:,.1f} MiB, hits "
        f"{cold[-1].cache['hits']}, misses {cold[-1].cache['misses']}, prefetches {cold[-1].cache['prefetches']}",
        f"(g) peak RSS per round (ru_maxrss): {', '.join(f'{c.peak_rss_bytes / MiB:,.1f}' for c in cold)} MiB; highest: "
        f"VmHWM {worst.high_water_rss_bytes / MiB:,.1f}, RSS before its scan {worst.rss_before_scan_bytes / MiB:,.1f}, "
        f"inherited {worst.inherited_peak_rss_bytes / MiB:,.1f}, cache budget {worst.cache_budget_bytes / MiB:,.0f} MiB",
        "(j) cold random 4 KiB read, GETs / MiB fetched: " + ", ".join(
            f"{c.random_read_gets} / {c.random_read_fetched_bytes / MiB:g}" for c in cold),
        f"(h) wake-up ({start.samples} PD appends of 1 KiB every {WAKE_INTERVAL_S * 1e3:g} ms, {missed} missed): from "
        f"the append's call {start.text()}; from its return p50 {returned.p50_us:,.1f} us, p99 {returned.p99_us:,.1f} us",
    ]
    checks = [
        Check.over("(a) / (b) cold scan vs cat_file", ratios(column("a"), column("b")), 1.0, True),
        Check.over("(a) / (c) cold scan vs cat_ranges", ratios(column("a"), column("c")), 0.70, True),
        Check.over("(i) / (b) fsspec direct vs cat_file", ratios(column("i"), column("b")), 1.0, True),
        Check("(f) GETs / (bytes / 1 MiB)", max(c.cache["gets"] for c in cold) / (size / MiB), 1.0, False, "x"),
        Check("(f) bytes fetched twice", (max(c.cache["fetched_bytes"] for c in cold) - size) / MiB, 0.0, False, "MiB"),
        Check("(j) GETs of a cold random 4 KiB read", max(c.random_read_gets for c in cold), 1, False),
        Check("(j) MiB fetched by it", max(c.random_read_fetched_bytes for c in cold) / MiB, 1.0, False, "MiB"),
        Check("(g) peak RSS of cold scan", worst.peak_rss_bytes / MiB,
              (worst.cache_budget_bytes + RSS_SLACK_BYTES) / MiB, False, "MiB"),
        Check("(h) wake-up p99", start.p99_us / 1000, 20.0, False, "ms"),
    ]
    title = (f"read benchmark: {size / MiB:g} MiB segment in {objects} S3 objects (s3rver on 127.0.0.1); "
             f"MB/s, median of {len(rounds)} rounds")
    data = {"rounds": [dataclasses.asdict(r) for r in rounds], "warm": warm, "wake": wake,
            "medians_mb_per_s": {label: statistics.median(t.mb_per_s for t in column(key)) for key, label in ROWS.items()}}
    return Report(title, [table(["measurement", "MB/s", "min", "max"], rows), per_round, details], checks, data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--random-reads", type=int, default=20_000, help="random 4 KiB reads in (e)")
    parser.add_argument("--wake-samples", type=int, default=400, help="appends timed in (h)")
    add_size_rounds_arguments(parser, 256, 5, "store, S3 server data")


def run(args: argparse.Namespace) -> int:
    return run_scenario("read", args, lambda directory: measure(directory, args))
