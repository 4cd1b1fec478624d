"""Read benchmark: tierfs reads from an S3 tier-2 (s3rver on 127.0.0.1) next to raw s3fs
ceilings on the same server, seconds apart.

A store whose tier-2 is ``s3://tierfs-bench/chunks`` gets a segment of ``--size-mib``
(256) MiB by 1 MiB PD appends, flushed (4-16 MiB objects). Each of ``--rounds`` (5)
measures, with the CPU of s3rver and of the client: (b) s3fs ``cat_file`` of each object
in turn; (c) s3fs 1 MiB ranges, 16 in flight (tierfs's block size and concurrency); the
bound, s3fs with the GET size and concurrency of tierfs's read-ahead; (a) a cold
sequential read in a fresh process (``harness.cold_scan``: empty 256 MiB cache, 1 MiB
reads) with (f) its GETs and bytes fetched, (g) its peak RSS and (j) what one cold random
4 KiB read fetches; (i) the fsspec direct read (``DirectChunkReader``, what
``TierFileSystem.cat_file`` does) and (k) its ceiling, the whole objects in parallel,
joined (taking turns; both run once untimed first, so neither pays for growing the heap).
Then once: (d) the warm re-read, best of 10, taking turns with its ceiling (the blocks
from a dict, no copy, one trio checkpoint per read as tierfs's reader); (e) 20,000 random
4 KiB warm reads; (h) the wake-up of a task in ``wait_for_data`` from the call of a PD
append, 400 appends.

Targets (issue 3, 19), medians of the rounds' ratios: (a) >= 1.0 x (b) and >= 0.70 x
(c); (i) >= 1.0 x (b); GETs <= bytes / 1 MiB, no byte fetched twice; (j) one GET of
1 MiB; peak RSS <= cache budget + 150 MiB; wake-up p99 <= 20 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any, TypeVar

import trio

from benchmarks.harness import procfs, s3
from benchmarks.harness.cold_scan import ColdScan, ColdScanChild, spec
from benchmarks.harness.figures import Check, Latency, MiB, Throughput, make_payload, ratios
from benchmarks.harness.scenario import Report, alternate, rounds_table, say, size_rounds
from benchmarks.harness.stores import random_reads, sequential_scan, warm_cache_bytes, write_segment
from tierfs import StoreConfig, open_store
from tierfs.blocks.filesystems import open_filesystem
from tierfs.remote.direct_read import RUN_BLOCKS, RUNS_IN_FLIGHT, DirectChunkReader, SegmentLayout

HELP = "cold/warm segment reads from S3 (s3rver) vs raw s3fs ceilings; RSS; tail wake-up"
SEGMENT, WAKE_SEGMENT = "bench/read", "bench/tail"
CEILING_IN_FLIGHT = 16  # (c): the default tier2_concurrency
WARM_PASSES, RANDOM_READS = 10, 20_000
RSS_SLACK_BYTES = 150 * MiB
WAKE_SAMPLES, WAKE_RECORD_BYTES, WAKE_INTERVAL_S, WAKE_TIMEOUT_S = 400, 1024, 0.005, 1.0
LEGEND = {"(a)": "tierfs cold sequential read, 1 MiB reads", "(i)": "fsspec direct read, whole segment",
          "(b)": "s3fs cat_file, whole objects one by one", "(c)": "s3fs cat_ranges, 1 MiB, 16 in flight",
          "bound": "s3fs cat_ranges, read-ahead's GETs", "(k)": "s3fs whole objects in parallel, joined"}
T = TypeVar("T")


@dataclasses.dataclass
class Round:
    figures: dict[str, Throughput]  # by key of LEGEND
    cpu: dict[str, tuple[float, float]]  # CPU s of s3rver and of the client
    cold: ColdScan
    direct_gets: int


def with_cpu(server_pid: int, run: Callable[[], T], client_cpu_s: Callable[[T], float] | None = None
             ) -> tuple[T, tuple[float, float]]:
    """``run()`` and the CPU it cost the server and this process (or ``client_cpu_s(result)``)."""
    server_s, client_s = procfs.cpu_s(server_pid), procfs.self_cpu_s()
    result = run()
    client_s = client_cpu_s(result) if client_cpu_s else procfs.self_cpu_s() - client_s
    return result, (procfs.cpu_s(server_pid) - server_s, client_s)


def direct_read(options: dict[str, Any], layout: s3.Layout, expected: bytes) -> tuple[Throughput, int]:
    """(i), with its client set up by one untimed HEAD as the ceilings' are; (figure, GETs)."""
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


def joined_ceiling(options: dict[str, Any], layout: s3.Layout, client: s3.Client | None = None) -> Throughput:
    """(k): every object whole, (i)'s concurrency, joined."""
    whole = max(chunk["end"] - chunk["start"] for chunk in layout)
    return s3.cat_ranges_ceiling(options, layout, whole, RUNS_IN_FLIGHT, joined=True, client=client)


def measure_round(endpoint: s3.S3Endpoint, layout: s3.Layout, request: dict[str, Any], child: ColdScanChild,
                  payload: bytes, index: int) -> Round:
    options, pid = endpoint.storage_options(), endpoint.pid
    figures, cpu = {}, {}
    ceilings: dict[str, Callable[[s3.Client], Throughput]] = {
        "(b)": lambda made: s3.cat_file_ceiling(options, layout, made),
        "(c)": lambda made: s3.cat_ranges_ceiling(options, layout, MiB, CEILING_IN_FLIGHT, client=made),
        "bound": lambda made: s3.readahead_ceiling(options, layout, made),
        "(k)": lambda made: joined_ceiling(options, layout, made)}
    gets = 0
    for key in ["(b)", "(c)", "bound", "(a)", *alternate(index + 1, ["(i)", "(k)"])]:
        if key == "(a)":
            cold, cpu[key] = with_cpu(pid, lambda: child.run(request), lambda scan: scan.scan_cpu_s)
            figures[key] = cold.throughput
        elif key == "(i)":
            (figures[key], gets), cpu[key] = with_cpu(pid, lambda: direct_read(options, layout, payload))
        else:
            client = s3.new_s3fs(options, layout[0]["url"])  # set up outside the CPU measurement, as (a)'s is
            figures[key], cpu[key] = with_cpu(pid, functools.partial(ceilings[key], client))
    return Round(figures, cpu, cold, gets)


async def memory_scan_s(blocks: dict[int, bytes], size: int) -> float:
    """(d)'s ceiling: the segment's 1 MiB blocks from a dict (built untimed), each handed
    back without a copy after one trio checkpoint."""
    start_s, total = perf_counter(), 0
    for offset in range(0, size, MiB):
        block = blocks[offset]
        await trio.lowlevel.checkpoint()
        total += len(block)
    if total != size:
        raise RuntimeError(f"the ceiling handed out {total} of {size} bytes")
    return perf_counter() - start_s


async def warm_reads(config: Any, payload: bytes) -> dict[str, Any]:
    size = len(payload)
    async with open_store(config) as store:
        await sequential_scan(store, SEGMENT, size, expected=payload)  # untimed: fills the cache, checks the bytes
        blocks = {offset: payload[offset : offset + MiB] for offset in range(0, size, MiB)}
        misses = store.block_cache.misses
        tierfs_s = ceiling_s = math.inf
        for index in range(WARM_PASSES):  # taking turns: a pass takes milliseconds
            for key in alternate(index, ["ceiling", "tierfs"]):
                if key == "ceiling":
                    ceiling_s = min(ceiling_s, await memory_scan_s(blocks, size))
                else:
                    tierfs_s = min(tierfs_s, (await sequential_scan(store, SEGMENT, size))[0])
        return {"tierfs": Throughput(f"(d) tierfs warm re-read, best of {WARM_PASSES}", size, tierfs_s),
                "ceiling": Throughput(f"(d) ceiling: cached blocks, no copy, best of {WARM_PASSES}", size, ceiling_s),
                "misses": store.block_cache.misses - misses, "cache_bytes": config.block_cache_bytes,
                "random": await random_reads(store, SEGMENT, size, RANDOM_READS)}


async def wake_latency(config: Any) -> tuple[Latency, Latency, int]:
    """(h): (from the append's call, from its return, appends never seen)."""
    started_s, returned_s, woke_s = [0.0] * WAKE_SAMPLES, [0.0] * WAKE_SAMPLES, [math.nan] * WAKE_SAMPLES

    async def waiter(store: Any) -> None:
        seen = 0
        while seen < WAKE_SAMPLES * WAKE_RECORD_BYTES:
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
            for index in range(WAKE_SAMPLES):
                started_s[index] = perf_counter()
                await store.append(WAKE_SEGMENT, b"w" * WAKE_RECORD_BYTES)
                returned_s[index] = perf_counter()
                await trio.sleep(WAKE_INTERVAL_S)
            with trio.move_on_after(WAKE_TIMEOUT_S):
                while math.isnan(woke_s[-1]):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    seen = [i for i in range(WAKE_SAMPLES) if not math.isnan(woke_s[i])]
    return (Latency.of([woke_s[i] - started_s[i] for i in seen]), Latency.of([woke_s[i] - returned_s[i] for i in seen]),
            WAKE_SAMPLES - len(seen))


def measure(directory: Path, args: argparse.Namespace) -> Report:
    size = args.size_mib * MiB
    with contextlib.ExitStack() as stack:
        children = [stack.enter_context(ColdScanChild(directory / f"cold-scan-{i}.log"))  # before anything big
                    for i in range(args.rounds)]
        endpoint = stack.enter_context(s3.s3_server(directory / "s3rver"))
        options = endpoint.storage_options()

        def config(name: str) -> StoreConfig:
            return StoreConfig(data_dir=directory / name, tier2_url=f"s3://{s3.BUCKET}/{name}", tier2_options=options)

        async def write() -> s3.Layout:
            async with open_store(config("chunks")) as store:
                return await write_segment(store, SEGMENT, payload)

        payload = make_payload(size, 3)
        say(f"s3rver at {endpoint.url}; writing {args.size_mib} MiB ...")
        layout = trio.run(write)
        direct_read(options, layout, payload)  # untimed, see the module docstring
        joined_ceiling(options, layout)
        rounds = []
        for index, child in enumerate(children, 1):
            say(f"round {index}/{args.rounds}: (b), (c), bound, (a), (i), (k) ...")
            rounds.append(measure_round(endpoint, layout, spec(config("chunks"), SEGMENT, size), child, payload, index))
        say("(d), (e), (h) ...")
        warm = trio.run(warm_reads, config("chunks").replace(block_cache_bytes=warm_cache_bytes(size)), payload)
        wake = trio.run(wake_latency, config("wake"))
    return report(size, len(layout), rounds, warm, wake)


def report(size: int, objects: int, rounds: list[Round], warm: dict[str, Any],
           wake: tuple[Latency, Latency, int]) -> Report:
    columns = {key: [r.figures[key] for r in rounds] for key in LEGEND}
    per_round = [f"round {index}: CPU s, s3rver/client: " + "; ".join(
        f"{key} {server_s:.2f}/{client_s:.2f}" for key, (server_s, client_s) in r.cpu.items())
        + f"; GETs (a) {r.cold.cache['gets']} (i) {r.direct_gets}; (a) in the kernel {r.cold.scan_system_cpu_s:.2f} s, "
        f"{r.cold.scan_minor_faults:,} minor faults" for index, r in enumerate(rounds, 1)]
    cold = [r.cold for r in rounds]
    worst = max(cold, key=lambda c: c.peak_rss_bytes)
    start, returned, missed = wake
    details = [
        f"(d) warm cache {warm['cache_bytes'] / MiB:,.0f} MiB, misses in the timed scans {warm['misses']}: "
        f"{warm['tierfs'].mb_per_s:,.1f} MB/s, ceiling {warm['ceiling'].mb_per_s:,.1f}; tierfs / ceiling "
        f"{warm['tierfs'].mb_per_s / warm['ceiling'].mb_per_s:.3f}",
        f"(e) random 4 KiB reads, warm cache: {warm['random'].text()}",
        f"(f) GETs per cold scan: {', '.join(str(c.cache['gets']) for c in cold)} (bytes / 1 MiB = {size // MiB}); "
        f"last: fetched {cold[-1].cache['fetched_bytes'] / MiB:,.1f} MiB, hits {cold[-1].cache['hits']}, misses "
        f"{cold[-1].cache['misses']}, prefetches {cold[-1].cache['prefetches']}",
        f"(g) peak RSS per round (ru_maxrss): {', '.join(f'{c.peak_rss_bytes / MiB:,.1f}' for c in cold)} MiB; cache "
        f"budget {worst.cache_budget_bytes / MiB:,.0f} MiB",
        "(j) cold random 4 KiB read, GETs / MiB fetched: " + ", ".join(
            f"{c.random_read_gets} / {c.random_read_fetched_bytes / MiB:g}" for c in cold),
        f"(h) wake-up ({start.samples} PD appends of 1 KiB every {WAKE_INTERVAL_S * 1e3:g} ms, {missed} missed): from "
        f"the append's call {start.text()}; from its return p50 {returned.p50_us:,.1f} us, p99 {returned.p99_us:,.1f} us",
    ]
    checks = [
        Check.over("(a) / (b) cold scan vs cat_file", ratios(columns["(a)"], columns["(b)"]), 1.0, True),
        Check.over("(a) / (c) cold scan vs cat_ranges", ratios(columns["(a)"], columns["(c)"]), 0.70, True),
        Check.over("(i) / (b) fsspec direct vs cat_file", ratios(columns["(i)"], columns["(b)"]), 1.0, True),
        Check("(f) GETs / (bytes / 1 MiB)", max(c.cache["gets"] for c in cold) / (size / MiB), 1.0, False, "x"),
        Check("(f) bytes fetched twice", (max(c.cache["fetched_bytes"] for c in cold) - size) / MiB, 0.0, False, "MiB"),
        Check("(j) GETs of a cold random 4 KiB read", max(c.random_read_gets for c in cold), 1, False),
        Check("(j) MiB fetched by it", max(c.random_read_fetched_bytes for c in cold) / MiB, 1.0, False, "MiB"),
        Check("(g) peak RSS of cold scan", worst.peak_rss_bytes / MiB,
              (worst.cache_budget_bytes + RSS_SLACK_BYTES) / MiB, False, "MiB"),
        Check("(h) wake-up p99", start.p99_us / 1000, 20.0, False, "ms"),
    ]
    title = f"read benchmark: {size / MiB:g} MiB segment in {objects} S3 objects (s3rver on 127.0.0.1)"
    table = rounds_table(columns, [("(a)", "(b)"), ("(a)", "(c)"), ("(i)", "(b)"), ("(i)", "(k)"), ("bound", "(b)")])
    return Report(title, [[f"{key} {label}" for key, label in LEGEND.items()], table, per_round, details], checks,
                  {"rounds": [dataclasses.asdict(r) for r in rounds], "warm": warm, "wake": wake})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size_rounds(parser, 256, 5)
