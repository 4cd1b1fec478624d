"""Read benchmark: tierfs reads from an S3-protocol tier-2 next to raw s3fs ceilings.

One run starts its own S3-protocol server, s3rver (npm; installed into ``benchmarks/`` with
``npm ci`` on first use, see ``benchmarks/s3server.py``), on 127.0.0.1 with its data
in the scratch directory ``tmp-tierfs-bench-*`` under ``--dir`` (default: the current
directory; RAM filesystems are refused). s3rver answers a ranged GET by streaming that
range from the object's file, so there is no network and no object-size penalty, but
it does cost server CPU per request, on the same CPUs as the client; that is why every
tierfs figure is set next to ceilings measured with the same server seconds apart. The
server is stopped and the scratch directory removed at the end.

Set-up: a store whose tier-2 is ``s3://tierfs-bench/chunks`` on that server gets one
segment of ``--size-mib`` MiB (default 256) by 1 MiB PD appends, then
``await store.flush()``; with the default configuration each flush becomes one object
(4-16 MiB). The store is closed. Then ``--rounds`` rounds (default 5), each of:

- (b) raw s3fs ``cat_file`` of each chunk object, whole, one after another (one GET
  per object, default s3fs options): what a plain single-stream client gets;
- (c) raw s3fs ``cat_ranges`` of the same bytes as 1 MiB ranges (the block ranges tierfs
  asks for), 16 in flight (a sliding window): the ceiling for 1 MiB GETs at tierfs's
  default tier-2 concurrency (16), same client library and options as tierfs;
- (a) cold sequential read in a **child process** (fresh interpreter, fresh
  ``open_store`` with the default configuration, so the block cache is empty and its
  budget is the default 256 MiB): ``reader = store.open_reader(name)`` and
  ``await reader.read(offset, 1 MiB)`` from 0 to the end, wall time. In the same child:
  (f) the block cache's counters for the scan (GETs issued, bytes fetched, hits,
  misses, prefetches) and (g) peak RSS, ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
  right after the scan, with VmHWM and the RSS before the scan for context. One child
  per round, each started before the parent allocates anything (see
  ``ColdScanChild``: ru_maxrss is inherited across exec).

- (j) in the same child, after the scan: the block cache emptied, one 4 KiB read at a
  random 4 KiB-aligned offset through a fresh reader: the GETs and bytes it fetched
  (a random read is one 1 MiB block);
- (i) fsspec direct read (``read_bounds.direct_read``): the whole segment read by a
  fresh ``DirectChunkReader`` from the chunk objects, with the layout the daemon hands
  out (what ``TierFileSystem.cat_file`` does after its one layout request), checked
  against the bytes appended;
- bound: raw s3fs ``cat_ranges`` of the same bytes with the request size and the
  concurrency of tierfs's read-ahead at full window (``read_bounds.raw_runs``):
  s3rver's own throughput for tierfs's requests;
- (k) the ceiling of (i): raw s3fs ``cat_ranges`` of the whole objects with (i)'s
  concurrency, joined into one result (``read_bounds.raw_whole_joined``); (i) and (k)
  run once untimed before the first round, so neither pays for growing the heap of
  this process in a timed run, and take turns going first in the rounds.

Around each of (b), (c), the bound, (a) and (i) the CPU seconds of s3rver (its node
process) and of the client (this process, or the child for (a): its scan only) are
recorded: where the time goes on the 2 CPUs they share.

Each of (a), (b), (c), (i) and the bound first sets up its S3 client with one untimed
HEAD (creating a botocore client takes ~0.1 s, reported as "set-up"); the timed part is
the transfer. The table gives the median of the rounds; each target ratio is the median
of the rounds' own ratios (a round's figures are measured within seconds).

Then, once:

- (d) warm re-read: the store reopened with ``block_cache_bytes`` = max(300 MiB,
  1.25 x segment); one untimed scan fills the cache and checks every byte against what
  was appended; then the timed sequential scan (1 MiB reads through a new reader),
  best of 10, next to its ceiling (``MemoryLookup``), best of 10, the two taking turns
  (a pass takes a few milliseconds, so one pass can lose its core to another tenant):
  the same 1 MiB blocks, held as ``bytes`` in a dict by offset, handed back without a
  copy by an async read in the same trio run that yields to the scheduler once (a trio
  checkpoint). That is the least a trio reader serving cached immutable blocks does:
  tierfs returns a whole cached block as it is (no copy) and yields once per read too,
  so a reference that copies each block (as this one did before issue 19) is no
  bound: tierfs can beat it;
- (e) random 4 KiB reads (4 KiB-aligned offsets, uniform over the segment, seeded) on
  that warm cache through one reader, each timed: p50 and p99 latency;
- (h) tail wake-up: a fresh store (default configuration, S3 tier-2), one task appends
  1 KiB PD records every 5 ms, another loops on ``await store.wait_for_data(name,
  offset, timeout)``; latency is from the moment ``append`` was called to the moment
  the waiter runs again (the append's fdatasync included, since a tail reader only sees
  durable bytes). The wake-up relative to the append's *return* is reported too (it
  can be negative: both are woken by the same durable callback).

Why these comparisons: a tierfs scan cannot beat the same GETs issued by the same
client library with the same parallelism (c), and should not be slower than the
simplest client that fetches whole objects one by one (b); a warm read cannot beat
handing out the cached block with one checkpoint. The targets (issue 3):

- (a) >= 1.0 x (b) and (a) >= 0.70 x (c); (i) >= 1.0 x (b) (issue 19);
- GETs of the sequential scan <= segment bytes / 1 MiB, and bytes fetched = segment
  bytes (no block twice); (j) exactly one GET of 1 MiB;
- peak RSS of the cold scan <= cache budget (256 MiB) + 150 MiB;
- wake-up p99 <= 20 ms.

A missed target is reported, not an error: the exit code is 0 either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import random
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any, TextIO

import trio

from benchmarks.children import JsonLineChild
from benchmarks.common import (
    EXIT_OK,
    EXIT_USAGE,
    Check,
    Latency,
    MiB,
    Throughput,
    add_scratch_arguments,
    checks_json,
    format_checks,
    make_payload,
    print_sections,
    run_in_scratch,
    scratch_parent_problem,
    warm_cache_bytes,
)
from benchmarks.read_bounds import (
    CpuUse,
    DirectRead,
    direct_read,
    measured,
    process_cpu_s,
    raw_runs,
    raw_whole_joined,
    readahead_requests,
    s3rver_pid,
)
from tierfs import StoreConfig, open_store
from tierfs.engine.readahead import SegmentReader
from tierfs.remote.direct_read import RUNS_IN_FLIGHT
from tierfs.store.facade import SegmentStore

if TYPE_CHECKING:
    from benchmarks.s3server import S3Endpoint

HELP = "cold/warm segment reads from S3 (s3rver) vs raw s3fs ceilings; RSS; tail wake-up"

READ_BYTES = MiB  # one reader.read() in the sequential scans
CEILING_IN_FLIGHT = 16  # ranged GETs in flight in ceiling (c) = default tier2_concurrency
RANDOM_READ_BYTES = 4096
WARM_PASSES = 10  # warm scans of (d) and of its ceiling, taking turns; the best of each counts
RSS_SLACK_BYTES = 150 * MiB
WAKE_RECORD_BYTES = 1024
WAKE_INTERVAL_S = 0.005
WAKE_WAIT_TIMEOUT_S = 1.0
BUCKET = "tierfs-bench"
SEGMENT = "bench/read"
WAKE_SEGMENT = "bench/tail"
SEED = 3
CHILD_FLAG = "--child-cold-scan"


# ----------------------------------------------------------------------- figures
@dataclasses.dataclass(frozen=True)
class ColdScan:
    throughput: Throughput
    reads: int
    cache: dict[str, int]  # BlockCache.statistics() after the scan
    reader: dict[str, int]  # SegmentReader.statistics() after the scan
    cache_budget_bytes: int
    inherited_peak_rss_bytes: int  # ru_maxrss when the child started
    rss_before_scan_bytes: int  # VmRSS after open_store, before the first read
    high_water_before_scan_bytes: int  # VmHWM then (imports, open_store, recovery)
    peak_rss_bytes: int  # ru_maxrss right after the scan: the (g) figure
    high_water_rss_bytes: int  # VmHWM right after the scan
    scan_cpu_s: float  # the child's CPU seconds during the scan (all threads)
    scan_system_cpu_s: float  # of which in the kernel
    scan_minor_faults: int  # pages faulted in during the scan (the cache's fresh memory)
    random_read_gets: int  # (j) GETs of one cold 4 KiB read
    random_read_fetched_bytes: int


@dataclasses.dataclass(frozen=True)
class WarmResults:
    cache_bytes: int
    scan: Throughput
    memory_lookup: Throughput  # the ceiling: the same blocks from a dict, one checkpoint per read
    misses_during_timed_scans: int
    random_reads: Latency


@dataclasses.dataclass(frozen=True)
class WakeResults:
    interval_s: float
    from_append_start: Latency
    from_append_return: Latency  # signed: negative when the waiter ran first
    missed: int  # appends whose wake-up was never seen


@dataclasses.dataclass(frozen=True)
class Round:
    """(b), (c), the bound, (a) and (i), measured in this order within seconds of each
    other, each with the CPU it cost (``cpu``: by label b, c, bound, a, i)."""

    raw_cat_file: Throughput
    raw_cat_ranges: Throughput
    raw_runs: Throughput
    raw_joined: Throughput
    cold: ColdScan
    direct: DirectRead
    cpu: dict[str, CpuUse]

    @property
    def direct_versus_cat_file(self) -> float:
        return self.direct.throughput.mb_per_s / self.raw_cat_file.mb_per_s

    @property
    def bound_versus_cat_file(self) -> float:
        return self.raw_runs.mb_per_s / self.raw_cat_file.mb_per_s

    @property
    def direct_versus_joined(self) -> float:
        return self.direct.throughput.mb_per_s / self.raw_joined.mb_per_s

    @property
    def versus_cat_file(self) -> float:
        return self.cold.throughput.mb_per_s / self.raw_cat_file.mb_per_s

    @property
    def versus_cat_ranges(self) -> float:
        return self.cold.throughput.mb_per_s / self.raw_cat_ranges.mb_per_s

    @property
    def ranges_versus_cat_file(self) -> float:
        """(c) / (b): below 1, 1 MiB GETs cannot match whole-object GETs on this server."""
        return self.raw_cat_ranges.mb_per_s / self.raw_cat_file.mb_per_s


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    chunk_objects: int
    rounds: list[Round]
    warm: WarmResults
    wake: WakeResults

    def median_mb_per_s(self, pick: Callable[[Round], Throughput]) -> float:
        return statistics.median(pick(r).mb_per_s for r in self.rounds)

    def spread_mb_per_s(self, pick: Callable[[Round], Throughput]) -> tuple[float, float]:
        values = [pick(r).mb_per_s for r in self.rounds]
        return min(values), max(values)


# ----------------------------------------------------------------------- set-up
async def write_segment(config: StoreConfig, payload: bytes) -> list[dict[str, Any]]:
    """Create the segment by 1 MiB PD appends, flush it to tier-2; its chunk layout."""
    async with open_store(config) as store:
        await store.create(SEGMENT, make_parents=True)
        view = memoryview(payload)
        for offset in range(0, len(payload), MiB):
            await store.append(SEGMENT, view[offset : offset + MiB])
        await store.flush()
        layout = await store.chunk_layout(SEGMENT)
    flushed = sum(chunk["end"] - chunk["start"] for chunk in layout)
    if flushed != len(payload):
        raise RuntimeError(f"tier-2 holds {flushed} of {len(payload)} bytes after flush()")
    return layout


def new_s3fs(options: dict[str, Any], probe_url: str) -> tuple[Any, float]:
    """A fresh s3fs instance (no instance cache) whose client is set up by one HEAD
    of ``probe_url``, so no measurement includes creating the botocore client;
    returns (filesystem, seconds the HEAD took)."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    start_s = perf_counter()
    fs.info(probe_url)
    return fs, perf_counter() - start_s


# --------------------------------------------------------------- raw ceilings
def raw_cat_file(options: dict[str, Any], layout: list[dict[str, Any]],
                 client: tuple[Any, float] | None = None) -> Throughput:
    """(b) every chunk object whole, one GET after another (``client``: an s3fs set up
    by ``new_s3fs`` beforehand, or one is set up here)."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    total = 0
    start_s = perf_counter()
    for chunk in layout:
        total += len(fs.cat_file(chunk["url"]))
    elapsed_s = perf_counter() - start_s
    label = "(b) s3fs cat_file, whole objects one by one"
    return Throughput.of(label, total, elapsed_s, setup_s)


def block_ranges(layout: list[dict[str, Any]]) -> tuple[list[str], list[int], list[int]]:
    """The 1 MiB ranges tierfs reads: blocks aligned to each chunk's start (a chunk
    packed with others starts at its ``object_offset`` in the object)."""
    paths: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for chunk in layout:
        length = chunk["end"] - chunk["start"]
        place = chunk.get("object_offset", 0)
        for block_start in range(0, length, MiB):
            paths.append(chunk["url"])
            starts.append(place + block_start)
            ends.append(place + min(block_start + MiB, length))
    return paths, starts, ends


def raw_cat_ranges(options: dict[str, Any], layout: list[dict[str, Any]],
                   client: tuple[Any, float] | None = None) -> Throughput:
    """(c) the same bytes as 1 MiB ranged GETs, CEILING_IN_FLIGHT in flight."""
    fs, setup_s = client or new_s3fs(options, layout[0]["url"])
    paths, starts, ends = block_ranges(layout)
    start_s = perf_counter()
    blocks = fs.cat_ranges(paths, starts, ends, batch_size=CEILING_IN_FLIGHT, on_error="raise")
    elapsed_s = perf_counter() - start_s
    total = sum(len(block) for block in blocks)
    label = f"(c) s3fs cat_ranges, 1 MiB ranges, {CEILING_IN_FLIGHT} in flight"
    return Throughput.of(label, total, elapsed_s, setup_s)


# ------------------------------------------------------- (a) (f) (g) cold scan
def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """ru_maxrss: includes what the process inherited at exec (see ColdScanChild)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def high_water_rss_bytes() -> int:
    """VmHWM: the peak RSS of this process's own address space only."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


async def sequential_scan(store: SegmentStore, size: int, segment: str = SEGMENT) -> tuple[float, SegmentReader]:
    """Read the segment front to back through one new reader; (seconds, the reader)."""
    reader = store.open_reader(segment)
    offset = 0
    start_s = perf_counter()
    while offset < size:
        data = await reader.read(offset, READ_BYTES)
        if not data:
            raise RuntimeError(f"read at {offset} of {size} returned nothing")
        offset += len(data)
    return perf_counter() - start_s, reader


async def set_up_client(store: SegmentStore, segment: str = SEGMENT) -> float:
    """Untimed, as for the ceilings: one HEAD of the first chunk where it is (tier-2, or
    the long-term store once offloaded): sets up the S3 client; the block cache is not
    touched. Loads the chunk list too. Returns the seconds it took."""
    start_s = perf_counter()
    first = (await store.chunk_layout(segment))[0]
    long_term = store.offloader.long_term
    if first["offloaded"] and long_term is not None:
        await trio.to_thread.run_sync(long_term.stat, long_term.key_of(first["url"]))
    else:
        await trio.to_thread.run_sync(store.chunk_storage.stat, first["name"])
    return perf_counter() - start_s


async def cold_scan(spec: dict[str, Any], inherited_peak: int) -> ColdScan:
    config = StoreConfig(data_dir=Path(spec["data_dir"]), **spec["config"])
    async with open_store(config) as store:
        setup_s = await set_up_client(store, spec["segment"])
        rss_before = current_rss_bytes()
        high_water_before = high_water_rss_bytes()
        cpu_before_s, usage_before = process_cpu_s(), resource.getrusage(resource.RUSAGE_SELF)
        seconds, reader = await sequential_scan(store, spec["size"], spec["segment"])
        scan_cpu_s = process_cpu_s() - cpu_before_s
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
        peak, high_water = peak_rss_bytes(), high_water_rss_bytes()
        await trio.sleep(0.05)  # read-ahead past the end, if any, is counted too
        cache = dataclasses.asdict(store.block_cache.statistics())
        reader_stats = dataclasses.asdict(reader.statistics())
        random_gets, random_bytes = await cold_random_read(store, spec["size"], spec["segment"])
    label = f"(a) tierfs cold sequential read, {READ_BYTES // MiB} MiB reads"
    return ColdScan(
        throughput=Throughput.of(label, spec["size"], seconds, setup_s),
        reads=reader_stats["reads"],
        cache=cache,
        reader=reader_stats,
        cache_budget_bytes=config.block_cache_bytes,
        inherited_peak_rss_bytes=inherited_peak,
        rss_before_scan_bytes=rss_before,
        high_water_before_scan_bytes=high_water_before,
        peak_rss_bytes=peak,
        high_water_rss_bytes=high_water,
        scan_cpu_s=scan_cpu_s,
        scan_system_cpu_s=usage_after.ru_stime - usage_before.ru_stime,
        scan_minor_faults=usage_after.ru_minflt - usage_before.ru_minflt,
        random_read_gets=random_gets,
        random_read_fetched_bytes=random_bytes,
    )


async def cold_random_read(store: SegmentStore, size: int, segment: str) -> tuple[int, int]:
    """(j): the cache emptied, one 4 KiB read at a random 4 KiB-aligned offset (not 0:
    a fresh reader at 0 counts as sequential) through a fresh reader; (GETs, bytes)
    it fetched, read-ahead included."""
    store.block_cache.clear()
    before = store.block_cache.statistics()
    slots = max(2, size // RANDOM_READ_BYTES)
    offset = random.Random(SEED).randrange(1, slots) * RANDOM_READ_BYTES
    await store.open_reader(segment).read(offset, RANDOM_READ_BYTES)
    await trio.sleep(0.05)  # any read-ahead it started would show now
    after = store.block_cache.statistics()
    return after.gets - before.gets, after.fetched_bytes - before.fetched_bytes


def child_main() -> int:
    """The child process: wait for the scan's spec (one line of JSON on stdin), scan,
    print the figures as one line of JSON on stdout."""
    inherited_peak = peak_rss_bytes()
    line = sys.stdin.readline()
    if line:
        result = trio.run(cold_scan, json.loads(line), inherited_peak)
        print(json.dumps(dataclasses.asdict(result)), flush=True)
    return EXIT_OK


class ColdScanChild(JsonLineChild):
    """A process that runs one (a), started before the parent allocates anything big.

    Linux carries ru_maxrss across exec: a process started by ``subprocess`` (vfork +
    exec) begins with the parent's peak RSS. Started at the very beginning, the child
    inherits the parent's import-time peak (tens of MiB, below its own), so its
    ru_maxrss after the scan is its own peak. One process per round: a closed store
    sits in reference cycles, so its block cache is only freed by the cyclic garbage
    collector, and a second scan in the same process would start with the first
    one's cache still resident. Its stderr goes to ``log_path``.
    """

    def __init__(self, log_path: Path) -> None:
        super().__init__("benchmarks.read", CHILD_FLAG, log_path)

    def run(self, spec: dict[str, Any]) -> ColdScan:
        figures = self.request(spec)
        figures["throughput"] = Throughput(**figures["throughput"])
        return ColdScan(**figures)


# ---------------------------------------------------------- (d) (e) warm reads
class MemoryLookup:
    """The warm scan's ceiling: the same reads (1 MiB at each offset) served by a dict
    of the segment's 1 MiB blocks as ``bytes``, each handed back without a copy after
    one trio checkpoint, as tierfs's reader yields once per read served from memory.
    The blocks are built untimed."""

    def __init__(self, payload: bytes) -> None:
        self.size = len(payload)
        self.blocks = {offset: payload[offset : offset + READ_BYTES] for offset in range(0, self.size, READ_BYTES)}

    async def read(self, offset: int) -> bytes:
        block = self.blocks[offset]
        await trio.lowlevel.checkpoint()
        return block

    async def scan_s(self) -> float:
        """One pass over the segment, its seconds."""
        total = 0
        start_s = perf_counter()
        for offset in range(0, self.size, READ_BYTES):
            total += len(await self.read(offset))
        elapsed_s = perf_counter() - start_s
        if total != self.size:
            raise RuntimeError(f"the ceiling handed out {total} of {self.size} bytes")
        return elapsed_s


async def fill_and_verify(store: SegmentStore, payload: bytes) -> None:
    """Untimed: read everything once (fills the cache) and compare with the payload."""
    reader = store.open_reader(SEGMENT)
    for offset in range(0, len(payload), READ_BYTES):
        data = await reader.read(offset, READ_BYTES)
        if data != payload[offset : offset + READ_BYTES]:
            raise RuntimeError(f"bytes read at {offset} differ from the bytes appended")


async def random_reads(store: SegmentStore, size: int, count: int) -> Latency:
    rng = random.Random(SEED)
    slots = max(1, size // RANDOM_READ_BYTES)
    offsets = [rng.randrange(slots) * RANDOM_READ_BYTES for _ in range(count)]
    reader = store.open_reader(SEGMENT)
    latencies_s = []
    for offset in offsets:
        start_s = perf_counter()
        await reader.read(offset, RANDOM_READ_BYTES)
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s)


async def warm_reads(config: StoreConfig, payload: bytes, random_count: int) -> WarmResults:
    size = len(payload)
    async with open_store(config) as store:
        await fill_and_verify(store, payload)
        lookup = MemoryLookup(payload)
        misses_before = store.block_cache.misses
        ceiling_s, best_s = math.inf, math.inf
        for index in range(WARM_PASSES):  # taking turns: a pass takes milliseconds
            if index % 2 == 0:
                ceiling_s = min(ceiling_s, await lookup.scan_s())
            best_s = min(best_s, (await sequential_scan(store, size))[0])
            if index % 2 == 1:
                ceiling_s = min(ceiling_s, await lookup.scan_s())
        misses = store.block_cache.misses - misses_before
        latency = await random_reads(store, size, random_count)
    label = f"(d) tierfs warm re-read, {READ_BYTES // MiB} MiB reads, best of {WARM_PASSES}"
    return WarmResults(
        cache_bytes=config.block_cache_bytes,
        scan=Throughput.of(label, size, best_s),
        memory_lookup=Throughput.of(f"(d) ceiling: cached blocks, no copy, best of {WARM_PASSES}", size, ceiling_s),
        misses_during_timed_scans=misses,
        random_reads=latency,
    )


# --------------------------------------------------------------- (h) wake-up
async def tail_waiter(store: SegmentStore, woke_s: list[float]) -> None:
    """Wait for each new durable length; stamp every record it covers."""
    seen = 0
    total = len(woke_s) * WAKE_RECORD_BYTES
    while seen < total:
        length = await store.wait_for_data(WAKE_SEGMENT, seen, WAKE_WAIT_TIMEOUT_S)
        now_s = perf_counter()
        for index in range(seen // WAKE_RECORD_BYTES, length // WAKE_RECORD_BYTES):
            woke_s[index] = now_s
        seen = max(seen, length)


async def wake_latency(config: StoreConfig, samples: int) -> WakeResults:
    record = b"w" * WAKE_RECORD_BYTES
    started_s = [0.0] * samples
    returned_s = [0.0] * samples
    woke_s = [math.nan] * samples
    async with open_store(config) as store:
        await store.create(WAKE_SEGMENT, make_parents=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail_waiter, store, woke_s)
            await trio.sleep(0.05)  # the waiter is parked before the first append
            for index in range(samples):
                started_s[index] = perf_counter()
                await store.append(WAKE_SEGMENT, record)
                returned_s[index] = perf_counter()
                await trio.sleep(WAKE_INTERVAL_S)
            with trio.move_on_after(WAKE_WAIT_TIMEOUT_S):
                while math.isnan(woke_s[-1]):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    seen = [i for i in range(samples) if not math.isnan(woke_s[i])]
    return WakeResults(
        interval_s=WAKE_INTERVAL_S,
        from_append_start=Latency.of([woke_s[i] - started_s[i] for i in seen]),
        from_append_return=Latency.of([woke_s[i] - returned_s[i] for i in seen]),
        missed=samples - len(seen),
    )


# ------------------------------------------------------------------------ run
@dataclasses.dataclass(frozen=True)
class Options:
    size: int
    rounds: int
    random_reads: int
    wake_samples: int


def store_config(directory: Path, name: str, options: dict[str, Any]) -> StoreConfig:
    """Default configuration, tier-2 under ``s3://BUCKET/<name>`` on the server."""
    return StoreConfig(
        data_dir=directory / name, tier2_url=f"s3://{BUCKET}/{name}", tier2_options=options
    )


def cold_scan_spec(config: StoreConfig, size: int, segment: str = SEGMENT,
                   **settings: Any) -> dict[str, Any]:
    """What a ``ColdScanChild`` needs: the store (its data dir, tier-2 and any other
    ``settings``), the segment and its size."""
    return {
        "data_dir": str(config.data_dir),
        "config": {"tier2_url": config.tier2_url, "tier2_options": dict(config.tier2_options),
                   **settings},
        "segment": segment,
        "size": size,
    }


def measure_round(
    s3_options: dict[str, Any],
    layout: list[dict[str, Any]],
    spec: dict[str, Any],
    child: ColdScanChild,
    server_pid: int | None,
    payload: bytes,
    index: int,
) -> Round:
    run_bytes, in_flight = readahead_requests(StoreConfig().readahead_max_bytes)

    def client() -> tuple[Any, float]:  # set up outside the CPU measurement, as (a)'s is
        return new_s3fs(s3_options, layout[0]["url"])

    cat_file, cpu_b = measured(server_pid, functools.partial(raw_cat_file, s3_options, layout, client()))
    cat_ranges, cpu_c = measured(server_pid, functools.partial(raw_cat_ranges, s3_options, layout, client()))
    bound, cpu_bound = measured(
        server_pid, functools.partial(raw_runs, s3_options, layout, run_bytes, in_flight, client()))
    cold, cpu_a = measured(server_pid, lambda: child.run(spec), lambda scan: scan.scan_cpu_s)
    def measure_i() -> tuple[DirectRead, CpuUse]:
        return measured(server_pid, lambda: direct_read(s3_options, layout, payload))

    def measure_k() -> tuple[Throughput, CpuUse]:
        return measured(
            server_pid, functools.partial(raw_whole_joined, s3_options, layout, RUNS_IN_FLIGHT, client()))

    if index % 2:  # (i) and (k) take turns going first: neither always follows (a)
        (direct, cpu_i), (joined, cpu_k) = measure_i(), measure_k()
    else:
        (joined, cpu_k), (direct, cpu_i) = measure_k(), measure_i()
    cpu = {"b": cpu_b, "c": cpu_c, "bound": cpu_bound, "a": cpu_a, "i": cpu_i, "k": cpu_k}
    return Round(cat_file, cat_ranges, bound, joined, cold, direct, cpu)


def measure_all(
    directory: Path,
    opts: Options,
    endpoint: S3Endpoint,
    children: list[ColdScanChild],
    log: TextIO,
) -> Results:
    endpoint.create_bucket(BUCKET)
    s3_options = endpoint.storage_options()
    config = store_config(directory, "chunks", s3_options)
    payload = make_payload(opts.size, SEED)
    print(f"s3rver at {endpoint.url}; writing {opts.size // MiB} MiB ...", file=log, flush=True)
    layout = trio.run(write_segment, config, payload)
    server_pid = s3rver_pid(directory / "s3rver")
    # untimed: (i) and (k) once each, so neither pays for growing this process's heap
    # to the segment's size in a timed run (the first large read here faults in
    # hundreds of MiB of fresh memory; (b) reuses what earlier rounds freed)
    direct_read(s3_options, layout, payload)
    raw_whole_joined(s3_options, layout, RUNS_IN_FLIGHT)
    rounds = []
    for index, child in enumerate(children, 1):
        print(f"round {index}/{len(children)}: (b), (c), bound, (a), (i) ...", file=log, flush=True)
        spec = cold_scan_spec(config, opts.size)
        rounds.append(measure_round(s3_options, layout, spec, child, server_pid, payload, index))
    print("measuring (d), (e), (h) ...", file=log, flush=True)
    warm_config = config.replace(block_cache_bytes=warm_cache_bytes(opts.size))
    warm = trio.run(warm_reads, warm_config, payload, opts.random_reads)
    del payload
    wake = trio.run(wake_latency, store_config(directory, "wake", s3_options), opts.wake_samples)
    return Results(opts.size, len(layout), rounds, warm, wake)


def run_all(directory: Path, opts: Options, log: TextIO) -> Results:
    """Start the cold-scan children first (see ColdScanChild), then the S3 server."""
    from benchmarks.s3server import s3_server

    children: list[ColdScanChild] = []
    try:
        for index in range(opts.rounds):
            children.append(ColdScanChild(directory / f"cold-scan-{index + 1}.log"))
        with s3_server(directory / "s3rver", log) as endpoint:
            return measure_all(directory, opts, endpoint, children, log)
    finally:
        for child in children:
            child.close()


# --------------------------------------------------------------------- targets
def expected_gets(size: int) -> float:
    return size / MiB


def gets_ratio(r: Results) -> float:
    """The worst round's GETs / (segment bytes / 1 MiB)."""
    return max(rnd.cold.cache["gets"] for rnd in r.rounds) / expected_gets(r.size_bytes)


def refetched_bytes(r: Results) -> int:
    """The worst round's bytes fetched beyond the segment's (a block fetched twice)."""
    return max(rnd.cold.cache["fetched_bytes"] for rnd in r.rounds) - r.size_bytes


def evaluate_targets(r: Results) -> list[Check]:
    """Throughput ratios: the median over rounds of each round's own ratio."""
    budget = r.rounds[0].cold.cache_budget_bytes
    return [
        Check(
            "(a) / (b) cold scan vs cat_file",
            statistics.median(rnd.versus_cat_file for rnd in r.rounds), 1.0, True, "x",
        ),
        Check(
            "(a) / (c) cold scan vs cat_ranges",
            statistics.median(rnd.versus_cat_ranges for rnd in r.rounds), 0.70, True, "x",
        ),
        Check(
            "(i) / (b) fsspec direct vs cat_file",
            statistics.median(rnd.direct_versus_cat_file for rnd in r.rounds), 1.0, True, "x",
        ),
        Check("(f) GETs / (bytes / 1 MiB)", gets_ratio(r), 1.0, False, "x"),
        Check("(f) bytes fetched twice", refetched_bytes(r) / MiB, 0.0, False, "MiB"),
        Check("(j) GETs of a cold random 4 KiB read", max(rnd.cold.random_read_gets for rnd in r.rounds),
              1, False),
        Check("(j) MiB fetched by it", max(rnd.cold.random_read_fetched_bytes for rnd in r.rounds) / MiB,
              1.0, False, "MiB"),
        Check(
            "(g) peak RSS of cold scan",
            max(rnd.cold.peak_rss_bytes for rnd in r.rounds) / MiB,
            (budget + RSS_SLACK_BYTES) / MiB,
            False,
            "MiB",
        ),
        Check("(h) wake-up p99", r.wake.from_append_start.p99_us / 1000, 20.0, False, "ms"),
    ]


# ---------------------------------------------------------------------- report
SCAN_ROWS: tuple[tuple[str, Callable[[Round], Throughput]], ...] = (
    ("(a) tierfs cold sequential read, 1 MiB reads", lambda rnd: rnd.cold.throughput),
    ("(i) fsspec direct read, whole segment", lambda rnd: rnd.direct.throughput),
    ("(b) s3fs cat_file, whole objects one by one", lambda rnd: rnd.raw_cat_file),
    (f"(c) s3fs cat_ranges, 1 MiB, {CEILING_IN_FLIGHT} in flight", lambda rnd: rnd.raw_cat_ranges),
    ("bound: s3fs cat_ranges, read-ahead's GETs", lambda rnd: rnd.raw_runs),
    ("(k) s3fs whole objects in parallel, joined", lambda rnd: rnd.raw_joined),
)


def format_throughputs(r: Results) -> list[str]:
    header = f"{'measurement':<48} {'MB/s':>8} {'min':>8} {'max':>8}"
    lines = [header, "-" * len(header)]
    for label, pick in SCAN_ROWS:
        low, high = r.spread_mb_per_s(pick)
        lines.append(f"{label:<48} {r.median_mb_per_s(pick):>8,.1f} {low:>8,.1f} {high:>8,.1f}")
    for t in (r.warm.scan, r.warm.memory_lookup):
        lines.append(f"{t.label:<48} {t.mb_per_s:>8,.1f} {'-':>8} {'-':>8}")
    return lines


def format_rounds(r: Results) -> list[str]:
    lines = []
    for index, rnd in enumerate(r.rounds, 1):
        setups = "/".join(
            f"{t.setup_s * 1000:.0f}"
            for t in (rnd.cold.throughput, rnd.raw_cat_file, rnd.raw_cat_ranges)
        )
        lines.append(
            f"round {index}: (a) {rnd.cold.throughput.mb_per_s:,.1f}  (i) "
            f"{rnd.direct.throughput.mb_per_s:,.1f}  (b) {rnd.raw_cat_file.mb_per_s:,.1f}  (c) "
            f"{rnd.raw_cat_ranges.mb_per_s:,.1f}  bound {rnd.raw_runs.mb_per_s:,.1f}  (k) "
            f"{rnd.raw_joined.mb_per_s:,.1f} MB/s; "
            f"(a)/(b) {rnd.versus_cat_file:.3f}, (i)/(b) {rnd.direct_versus_cat_file:.3f}, "
            f"(a)/(c) {rnd.versus_cat_ranges:.3f}, (c)/(b) {rnd.ranges_versus_cat_file:.3f}, "
            f"bound/(b) {rnd.bound_versus_cat_file:.3f}, (i)/(k) {rnd.direct_versus_joined:.3f}; "
            f"untimed client set-up a/b/c {setups} ms"
        )
        cpu = "; ".join(f"{label} {use.server_s:.2f}/{use.client_s:.2f}" for label, use in rnd.cpu.items())
        lines.append(f"  CPU s, s3rver/client, {r.size_bytes / MiB:g} MiB: {cpu}; "
                     f"GETs (a) {rnd.cold.cache['gets']} (i) {rnd.direct.gets}; (a) in the kernel "
                     f"{rnd.cold.scan_system_cpu_s:.2f} s, {rnd.cold.scan_minor_faults:,} minor faults")
    return lines


def format_cold_details(r: Results) -> list[str]:
    last = r.rounds[-1].cold
    cache = last.cache
    gets = ", ".join(str(rnd.cold.cache["gets"]) for rnd in r.rounds)
    peaks = ", ".join(f"{rnd.cold.peak_rss_bytes / MiB:,.1f}" for rnd in r.rounds)
    worst = max((rnd.cold for rnd in r.rounds), key=lambda cold: cold.peak_rss_bytes)
    return [
        f"(f) cold scan GETs per round: {gets} (bytes / 1 MiB = "
        f"{expected_gets(r.size_bytes):.0f}; of the last round's, {cache['run_gets']} fetched runs of "
        f"blocks); last round: {last.reads} reads, fetched "
        f"{cache['fetched_bytes'] / MiB:,.1f} MiB of {r.size_bytes / MiB:,.0f} MiB read, "
        f"hits {cache['hits']}, misses {cache['misses']}, prefetches {cache['prefetches']}, "
        f"evictions {cache['evictions']}",
        f"(g) cold scan peak RSS (ru_maxrss) per round: {peaks} MiB; highest round: VmHWM "
        f"{worst.high_water_rss_bytes / MiB:,.1f} MiB; before its scan: RSS "
        f"{worst.rss_before_scan_bytes / MiB:,.1f} MiB, VmHWM "
        f"{worst.high_water_before_scan_bytes / MiB:,.1f} MiB; ru_maxrss inherited at start "
        f"{worst.inherited_peak_rss_bytes / MiB:,.1f} MiB; cache budget "
        f"{worst.cache_budget_bytes / MiB:,.0f} MiB",
        "(j) cold random 4 KiB read, GETs / MiB fetched per round: " + ", ".join(
            f"{rnd.cold.random_read_gets} / {rnd.cold.random_read_fetched_bytes / MiB:g}" for rnd in r.rounds),
    ]


def warm_read_us(figure: Throughput, size: int) -> float:
    return figure.seconds / (size / READ_BYTES) * 1e6


def format_details(r: Results) -> list[str]:
    warm, wake = r.warm, r.wake
    rnd, start, ret = warm.random_reads, wake.from_append_start, wake.from_append_return
    return [
        f"(d) warm cache {warm.cache_bytes / MiB:,.0f} MiB; misses during the timed warm "
        f"scans: {warm.misses_during_timed_scans}; per 1 MiB read: tierfs "
        f"{warm_read_us(warm.scan, r.size_bytes):,.1f} us, ceiling "
        f"{warm_read_us(warm.memory_lookup, r.size_bytes):,.1f} us; tierfs / ceiling "
        f"{warm.scan.mb_per_s / warm.memory_lookup.mb_per_s:.3f}",
        f"(e) random {RANDOM_READ_BYTES} B reads, warm cache ({rnd.samples:,}): "
        f"p50 {rnd.p50_us:,.1f} us, p99 {rnd.p99_us:,.1f} us, max {rnd.max_us:,.1f} us",
        *format_cold_details(r),
        f"(h) wake-up from append start ({start.samples} PD appends of "
        f"{WAKE_RECORD_BYTES} B, every {wake.interval_s * 1000:g} ms, {wake.missed} missed): "
        f"p50 {start.p50_us:,.1f} us, p99 {start.p99_us:,.1f} us, max {start.max_us:,.1f} us; "
        f"from append return: p50 {ret.p50_us:,.1f} us, p99 {ret.p99_us:,.1f} us",
    ]


def print_report(machine: dict[str, Any], r: Results, checks: list[Check], out: TextIO) -> None:
    fs = machine["filesystem"]
    print(
        f"read benchmark: {r.size_bytes / MiB:g} MiB segment in {r.chunk_objects} S3 objects "
        f"(s3rver on 127.0.0.1), {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']}",
        file=out,
    )
    print(f"(a), (b), (c): median of {len(r.rounds)} rounds", file=out)
    print(file=out)
    sections = [format_throughputs(r), format_rounds(r), format_details(r), format_checks(checks)]
    print_sections(sections, out)


def report_json(machine: dict[str, Any], r: Results, checks: list[Check]) -> dict[str, Any]:
    return {
        "benchmark": "read",
        "read_bytes": READ_BYTES,
        "ceiling_in_flight": CEILING_IN_FLIGHT,
        "s3_server": "s3rver (npm) on 127.0.0.1",
        "machine": machine,
        "medians_mb_per_s": {label: r.median_mb_per_s(pick) for label, pick in SCAN_ROWS},
        "round_ratios": [
            {
                "a_over_b": rnd.versus_cat_file,
                "i_over_b": rnd.direct_versus_cat_file,
                "a_over_c": rnd.versus_cat_ranges,
                "c_over_b": rnd.ranges_versus_cat_file,
                "bound_over_b": rnd.bound_versus_cat_file,
                "i_over_k": rnd.direct_versus_joined,
            }
            for rnd in r.rounds
        ],
        "results": dataclasses.asdict(r),
        "targets": checks_json(checks),
    }


# ------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size-mib", type=int, default=256, help="segment size in MiB (default 256)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of (b), (c), (a) (default 5; medians)"
    )
    parser.add_argument(
        "--random-reads", type=int, default=20_000, help="random 4 KiB reads in (e)"
    )
    parser.add_argument("--wake-samples", type=int, default=400, help="appends timed in (h)")
    add_scratch_arguments(parser, "store, S3 server data")


def usage_error(args: argparse.Namespace) -> str | None:
    counts = (args.size_mib, args.rounds, args.random_reads, args.wake_samples)
    if min(counts) < 1:
        return "--size-mib, --rounds, --random-reads and --wake-samples must be >= 1"
    return scratch_parent_problem(args.dir)


def run(args: argparse.Namespace) -> int:
    from benchmarks.s3server import S3ServerError

    problem = usage_error(args)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    opts = Options(args.size_mib * MiB, args.rounds, args.random_reads, args.wake_samples)
    return run_in_scratch(
        "read", args.dir, args.json,
        lambda directory: run_all(directory, opts, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(S3ServerError,),
    )


if __name__ == "__main__" and sys.argv[1:2] == [CHILD_FLAG]:
    sys.exit(child_main())
