"""Offload benchmark: tierfs offloading a segment to S3 next to s3fs uploading the same
chunk files with parallel multipart uploads, on the same server, in one run.

One run starts its own S3-protocol server, s3rver (npm, see ``benchmarks/s3server.py``),
on 127.0.0.1 with its data in the scratch directory ``tmp-tierfs-bench-*`` under ``--dir``
(default: the current directory; RAM filesystems are refused). The store's chunk store
is a local directory in the same scratch directory (the default tier-2); its long-term
store is ``s3://tierfs-bench/longterm`` on that server.

Each of ``--rounds`` rounds (default 3):

- set-up (untimed): a new segment of ``--size-mib`` MiB (default 1024) by 1 MiB VD
  appends, sealed and flushed: 64 MiB chunks (the default ``max_chunk_bytes``), as
  files in the chunk store;
- (c) the ceiling: s3fs ``put`` of those chunk files to other keys of the same bucket,
  parts of ``offload_part_bytes`` (8 MiB) with ``offload_upload_concurrency`` (8) parts
  in flight per file and ``offload_concurrency`` (2) files at once: the same
  parallelism tierfs uses, with the same client library, reading the same files;
- (a) tierfs: ``await store.offload(name)`` and wait until its status is SUCCESS, wall
  time: per chunk the attempt UUID is recorded (one SQLite transaction), the chunk read
  and every 1 MiB block CRC-checked, the data object uploaded (multipart), the index
  object uploaded, the completion recorded.

The order of (a) and (c) alternates between rounds. The target (issue 6) is the median
of the rounds' (a)/(c) ratios >= 0.80.

Then cold sequential reads after offload, as in the read-path benchmark: the store is
reopened with the deletion lag at 0, so the last round's chunk-store copies are deleted
and every block must come from the long-term store, and its bytes are checked against
the payload; closed again. Then ``--rounds`` times: (d) a fresh child process (the read
benchmark's ``ColdScanChild``, all started before the payload exists: empty block
cache, default configuration plus the long-term store) scans the segment with 1 MiB
reads through one reader, after one untimed HEAD that sets up its S3 client; right
before it, on the same data objects, (e) raw s3fs ``cat_ranges`` of the same 1 MiB
ranges, 16 in flight (tierfs's tier-2 concurrency) as a sliding window (fsspec starts
the next GET as soon as one finishes; until issue 19 this ceiling ran batches of 16
with a barrier after each, which is no bound: a reader that keeps 16 in flight beats
it), and the bound: raw s3fs ``cat_ranges`` with the request size and concurrency of
tierfs's read-ahead at full window (``read_bounds.raw_runs``: 16 MiB ranges, 2 in
flight, sliding), s3rver's own throughput for the GETs tierfs makes. Reported: the
median over the rounds of (d)/(e) with the read path's target, >= 0.70, and of
(d)/bound; GETs per cold read <= bytes / 1 MiB.

A missed target is reported, not an error: the exit code is 0 either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

from benchmarks.common import (
    Check,
    MiB,
    Throughput,
    add_size_rounds_arguments,
    checks_json,
    format_checks,
    make_payload,
    print_sections,
    run_size_rounds,
)

HELP = "offload of a 1 GiB segment to S3 vs s3fs parallel multipart upload (s3rver)"
BUCKET = "tierfs-bench"


@dataclasses.dataclass(frozen=True)
class Round:
    tierfs: Throughput
    ceiling: Throughput
    chunks: int

    @property
    def ratio(self) -> float:
        return self.tierfs.mb_per_s / self.ceiling.mb_per_s


@dataclasses.dataclass(frozen=True)
class ReadRound:
    """One cold read after offload, with its ceilings measured seconds before it."""

    cold: Throughput  # (d)
    ranges: Throughput  # (e) 1 MiB GETs, sliding window
    bound: Throughput  # read-ahead's GET size and concurrency
    gets: int


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    part_bytes: int
    upload_concurrency: int
    offload_concurrency: int
    rounds: list[Round]
    reads: list[ReadRound]

    @property
    def median_ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)

    @property
    def read_ratio(self) -> float:
        """Median over the read rounds of (d) / (e)."""
        return statistics.median(r.cold.mb_per_s / r.ranges.mb_per_s for r in self.reads)

    @property
    def bound_ratio(self) -> float:
        """Median over the read rounds of (d) / the bound."""
        return statistics.median(r.cold.mb_per_s / r.bound.mb_per_s for r in self.reads)


async def _make_segment(store: Any, name: str, payload: bytes) -> list[Any]:
    await store.create(name, durability="vd", make_parents=True)
    for start in range(0, len(payload), MiB):
        await store.append(name, payload[start : start + MiB])
    await store.seal(name)
    await store.flush(name)
    return list(await store.chunks_of(store._segment(name)))


async def _offload(store: Any, name: str) -> float:
    import trio

    started = perf_counter()
    await store.offload(name)
    while (status := await store.offload_status(name))["state"] == "RUNNING":
        await trio.sleep(0.005)
    seconds = perf_counter() - started
    if status["state"] != "SUCCESS":
        raise RuntimeError(f"offload failed: {status['error']}")
    return seconds


def _ceiling_upload(endpoint: Any, files: list[Path], round_index: int, config: Any) -> float:
    import s3fs

    fs = s3fs.S3FileSystem(**endpoint.storage_options())
    fs.info(f"{BUCKET}")  # untimed: sets up the client
    targets = [f"{BUCKET}/ceiling/r{round_index}/{path.name}" for path in files]
    started = perf_counter()
    fs.put([str(p) for p in files], targets, chunksize=config.offload_part_bytes,
           max_concurrency=config.offload_upload_concurrency, batch_size=config.offload_concurrency)
    seconds = perf_counter() - started
    fs.rm(f"{BUCKET}/ceiling/r{round_index}", recursive=True)
    return seconds


def _read_ceilings(options: dict[str, Any], layout: list[dict[str, Any]]) -> tuple[Throughput, Throughput]:
    """(e) and the bound on the data objects, each with its own s3fs client set up
    (one untimed HEAD) beforehand."""
    from benchmarks.read import new_s3fs, raw_cat_ranges
    from benchmarks.read_bounds import raw_runs, readahead_requests
    from tierfs import StoreConfig

    ranges = raw_cat_ranges(options, layout, new_s3fs(options, layout[0]["url"]))
    run_bytes, in_flight = readahead_requests(StoreConfig().readahead_max_bytes)
    bound = raw_runs(options, layout, run_bytes, in_flight, new_s3fs(options, layout[0]["url"]))
    return ranges, bound


def run_all(directory: Path, size: int, rounds: int, log: TextIO) -> Results:
    from benchmarks.read import ColdScanChild

    children = []  # one fresh process per cold read, all started before the payload exists
    try:
        for index in range(rounds):
            children.append(ColdScanChild(directory / f"cold-scan-{index + 1}.log"))
        return _measure(directory, size, rounds, children, log)
    finally:
        for child in children:
            child.close()


def _measure(directory: Path, size: int, rounds: int, children: list[Any], log: TextIO) -> Results:
    import trio

    from benchmarks.read import cold_scan_spec
    from benchmarks.s3server import s3_server
    from tierfs import StoreConfig, open_store
    from tierfs.engine.object_keys import OffloadKeys

    payload = make_payload(size, seed=6)
    with s3_server(directory / "s3rver", log) as endpoint:
        endpoint.create_bucket(BUCKET)
        config = StoreConfig(
            data_dir=directory / "data", offload_url=f"s3://{BUCKET}/longterm",
            offload_options=endpoint.storage_options(), offload_deletion_lag_s=3600.0,
        )
        measured: list[Round] = []

        async def rounds_main() -> None:
            async with open_store(config) as store:
                for index in range(rounds):
                    name = f"bench/r{index}"
                    chunks = await _make_segment(store, name, payload)
                    files = [config.data_dir / "chunks" / c.name for c in chunks]
                    print(f"round {index + 1}/{rounds}: {len(chunks)} chunks", file=log, flush=True)
                    if index % 2 == 0:
                        ceiling_s = await trio.to_thread.run_sync(_ceiling_upload, endpoint, files, index, config)
                        tierfs_s = await _offload(store, name)
                    else:
                        tierfs_s = await _offload(store, name)
                        ceiling_s = await trio.to_thread.run_sync(_ceiling_upload, endpoint, files, index, config)
                    measured.append(Round(Throughput.of("tierfs offload", size, tierfs_s),
                                          Throughput.of("s3fs multipart put", size, ceiling_s), len(chunks)))
                    print(f"  tierfs {measured[-1].tierfs.mb_per_s:.0f} MB/s, s3fs "
                          f"{measured[-1].ceiling.mb_per_s:.0f} MB/s", file=log, flush=True)

        trio.run(rounds_main)

        last = f"bench/r{rounds - 1}"
        read_config = config.replace(offload_deletion_lag_s=0.0)
        cold: dict[str, Any] = {}

        async def read_main() -> None:
            async with open_store(read_config) as store:
                seg = store._segment(last)
                await store.offload(last)  # deletes the due chunk-store copies
                while (await store.offload_status(last))["state"] == "RUNNING":
                    await trio.sleep(0.01)
                chunks = await store.chunks_of(seg)
                if not all(c.offload_hot_deleted for c in chunks):
                    raise RuntimeError("chunk-store copies were not deleted")
                cold["keys"] = [(OffloadKeys.for_attempt(c.name, c.offload_attempt_uuid).data, int(c.length))
                                for c in chunks]
                reader = store.open_reader(last)
                for offset in range(0, size, 16 * MiB):
                    if await reader.read(offset, 16 * MiB) != payload[offset : offset + 16 * MiB]:
                        raise RuntimeError(f"offloaded bytes differ in {offset}..{offset + 16 * MiB}")

        trio.run(read_main)
        layout = [{"url": f"s3://{BUCKET}/longterm/{key}", "start": 0, "end": length}
                  for key, length in cold["keys"]]
        spec = cold_scan_spec(read_config, size, last, offload_url=read_config.offload_url,
                              offload_options=dict(read_config.offload_options))
        reads = []
        for index, child in enumerate(children):
            print(f"cold read {index + 1}/{rounds}: (e), bound, (d) ...", file=log, flush=True)
            ranges, bound = _read_ceilings(endpoint.storage_options(), layout)
            for figure in (ranges, bound):
                if figure.nbytes != size:
                    raise RuntimeError(f"{figure.label} returned {figure.nbytes} of {size} bytes")
            scan = child.run(spec)
            reads.append(ReadRound(Throughput.of("tierfs cold read", size, scan.throughput.seconds),
                                   ranges, bound, scan.cache["gets"]))
    return Results(
        size_bytes=size, part_bytes=config.offload_part_bytes,
        upload_concurrency=config.offload_upload_concurrency,
        offload_concurrency=config.offload_concurrency, rounds=measured, reads=reads,
    )


def evaluate_targets(results: Results) -> list[Check]:
    return [
        Check("(a)/(c) offload vs s3fs multipart", results.median_ratio, 0.80, True, "x"),
        Check("(d)/(e) cold read vs raw 1 MiB GETs", results.read_ratio, 0.70, True, "x"),
        Check("GETs per MiB of the cold read", max(r.gets for r in results.reads) / (results.size_bytes / MiB),
              1.0, False, ""),
    ]


def print_report(machine: dict[str, Any], results: Results, checks: list[Check], out: TextIO) -> None:
    header = [
        f"offload benchmark: {results.size_bytes // MiB} MiB segment, s3rver on 127.0.0.1, "
        f"parts {results.part_bytes // MiB} MiB x {results.upload_concurrency} in flight, "
        f"{results.offload_concurrency} chunks at once",
        f"machine: {machine}",
    ]
    rows = [f"{'round':<6} {'(a) tierfs MB/s':>16} {'(c) s3fs MB/s':>14} {'(a)/(c)':>8}"]
    for i, r in enumerate(results.rounds, start=1):
        rows.append(f"{i:<6} {r.tierfs.mb_per_s:16.0f} {r.ceiling.mb_per_s:14.0f} {r.ratio:8.3f}")
    reads = [f"{'read':<6} {'(d) tierfs MB/s':>16} {'(e) 1 MiB GETs':>15} {'bound':>8} {'(d)/(e)':>8} "
             f"{'(d)/bound':>10} {'GETs':>6}"]
    for i, read in enumerate(results.reads, start=1):
        cold, ranges, bound = read.cold.mb_per_s, read.ranges.mb_per_s, read.bound.mb_per_s
        reads.append(f"{i:<6} {cold:16.0f} {ranges:15.0f} {bound:8.0f} {cold / ranges:8.3f} {cold / bound:10.3f} "
                     f"{read.gets:6d}")
    reads.append(f"median (d)/(e) {results.read_ratio:.3f}, (d)/bound {results.bound_ratio:.3f}; "
                  f"{results.reads[0].bound.label}")
    print_sections([header, rows, reads, format_checks(checks)], out)


def report_json(machine: dict[str, Any], results: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "results": dataclasses.asdict(results),
            "median_ratio": results.median_ratio, "read_ratio": results.read_ratio,
            "read_bound_ratio": results.bound_ratio, "targets": checks_json(checks)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 1024, 3, "store, S3 server data")


def run(args: argparse.Namespace) -> int:
    from benchmarks.s3server import S3ServerError

    return run_size_rounds(
        "offload", args, lambda directory, size, rounds: run_all(directory, size, rounds, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(S3ServerError, RuntimeError),
    )
