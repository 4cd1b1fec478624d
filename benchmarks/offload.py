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

Then, once, a cold sequential read after offload, as in the read-path benchmark: the
store is reopened with the deletion lag at 0, so the last round's chunk-store copies
are deleted and every block must come from the long-term store, and its bytes are
checked against the payload; closed again. (d) A fresh child process (the read
benchmark's ``ColdScanChild``: empty block cache, default configuration plus the
long-term store) scans the segment with 1 MiB reads through one reader, after one
untimed HEAD that sets up its S3 client; next to (e) raw s3fs ``cat_ranges`` of the same
1 MiB ranges of the data objects, 16 in flight (tierfs's tier-2 concurrency), measured
right after. Reported as (d)/(e) with the read path's target, >= 0.70.

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
READ_WINDOW = 16  # 1 MiB GETs in flight in the raw read ceiling (tier2_concurrency)


@dataclasses.dataclass(frozen=True)
class Round:
    tierfs: Throughput
    ceiling: Throughput
    chunks: int

    @property
    def ratio(self) -> float:
        return self.tierfs.mb_per_s / self.ceiling.mb_per_s


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    part_bytes: int
    upload_concurrency: int
    offload_concurrency: int
    rounds: list[Round]
    cold_read: Throughput
    raw_ranged_read: Throughput
    read_gets: int

    @property
    def median_ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)


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


def _raw_ranged_read(endpoint: Any, keys: list[tuple[str, int]]) -> tuple[float, int]:
    import s3fs

    fs = s3fs.S3FileSystem(**endpoint.storage_options())
    fs.info(f"{BUCKET}")
    paths, starts, ends = [], [], []
    for key, length in keys:
        for start in range(0, length, MiB):
            paths.append(f"{BUCKET}/longterm/{key}")
            starts.append(start)
            ends.append(min(start + MiB, length))
    started = perf_counter()
    total = 0
    for i in range(0, len(paths), READ_WINDOW):
        blocks = fs.cat_ranges(paths[i : i + READ_WINDOW], starts[i : i + READ_WINDOW],
                               ends[i : i + READ_WINDOW])
        total += sum(len(b) for b in blocks)
    return perf_counter() - started, total


def run_all(directory: Path, size: int, rounds: int, log: TextIO) -> Results:
    from benchmarks.read import ColdScanChild

    child = ColdScanChild(directory / "cold-scan.log")  # before the payload exists
    try:
        return _measure(directory, size, rounds, child, log)
    finally:
        child.close()


def _measure(directory: Path, size: int, rounds: int, child: Any, log: TextIO) -> Results:
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
        scan = child.run(cold_scan_spec(
            read_config, size, last, offload_url=read_config.offload_url,
            offload_options=dict(read_config.offload_options)))
        cold["seconds"] = scan.throughput.seconds
        cold["gets"] = scan.cache["gets"]
        raw_s, raw_bytes = _raw_ranged_read(endpoint, cold["keys"])
        if raw_bytes != size:
            raise RuntimeError(f"raw ranged read returned {raw_bytes} of {size} bytes")
    return Results(
        size_bytes=size, part_bytes=config.offload_part_bytes,
        upload_concurrency=config.offload_upload_concurrency,
        offload_concurrency=config.offload_concurrency, rounds=measured,
        cold_read=Throughput.of("tierfs cold read", size, cold["seconds"]),
        raw_ranged_read=Throughput.of("raw 1 MiB ranged GETs", size, raw_s),
        read_gets=cold["gets"],
    )


def evaluate_targets(results: Results) -> list[Check]:
    return [
        Check("(a)/(c) offload vs s3fs multipart", results.median_ratio, 0.80, True, "x"),
        Check("(d)/(e) cold read vs raw GETs", results.cold_read.mb_per_s / results.raw_ranged_read.mb_per_s,
              0.70, True, "x"),
        Check("GETs per MiB of the cold read", results.read_gets / (results.size_bytes / MiB), 1.02, False, ""),
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
    reads = [
        f"(d) cold read after offload   {results.cold_read.mb_per_s:8.0f} MB/s ({results.read_gets} GETs)",
        f"(e) raw 1 MiB ranged GETs     {results.raw_ranged_read.mb_per_s:8.0f} MB/s",
    ]
    print_sections([header, rows, reads, format_checks(checks)], out)


def report_json(machine: dict[str, Any], results: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "results": dataclasses.asdict(results),
            "median_ratio": results.median_ratio, "targets": checks_json(checks)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 1024, 3, "store, S3 server data")


def run(args: argparse.Namespace) -> int:
    from benchmarks.s3server import S3ServerError

    return run_size_rounds(
        "offload", args, lambda directory, size, rounds: run_all(directory, size, rounds, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(S3ServerError, RuntimeError),
    )
