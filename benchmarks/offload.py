"""Offload benchmark: tierfs offloading a segment to S3 (s3rver) next to s3fs uploading the
same chunk files with tierfs's parallelism, and cold reads after offload.

The store's chunk store is local; its long-term store ``s3://tierfs-bench/longterm``.
Each of ``--rounds`` (3), the order of (a) and (c) alternating: a new segment of
``--size-mib`` (1024) MiB by 1 MiB VD appends, sealed and flushed (64 MiB chunk files);
(c) s3fs ``put`` of those files with ``offload_part_bytes`` parts,
``offload_upload_concurrency`` parts and ``offload_concurrency`` files at once; (a)
``store.offload`` until SUCCESS (per chunk: attempt recorded, chunk read and checked,
data and index objects uploaded, completion recorded).

Then the last segment's local copies are deleted (deletion lag 0; its bytes checked)
and per round (d) a fresh process (``harness.cold_scan``) reads it from the long-term
store, right after (e) s3fs 1 MiB ranges, 16 in flight, and the read-ahead bound.
Targets: (a)/(c) >= 0.80 (issue 6); (d)/(e) >= 0.70; GETs <= bytes / 1 MiB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import s3
from benchmarks.harness.cold_scan import ColdScanChild, spec
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, ratios
from benchmarks.harness.scenario import (
    Report,
    add_size_rounds_arguments,
    at_least_one,
    run_scenario,
    table,
)

HELP = "offload of a 1 GiB segment to S3 vs s3fs parallel multipart upload (s3rver)"


async def offload_s(store: Any, name: str) -> float:
    started = perf_counter()
    await store.offload(name)
    while (status := await store.offload_status(name))["state"] == "RUNNING":
        await trio.sleep(0.005)
    if status["state"] != "SUCCESS":
        raise RuntimeError(f"offload failed: {status['error']}")
    return perf_counter() - started


def ceiling_upload_s(endpoint: s3.S3Endpoint, files: list[Path], index: int, config: Any) -> float:
    fs, _ = s3.new_s3fs(endpoint.storage_options(), s3.BUCKET)
    targets = [f"{s3.BUCKET}/ceiling/r{index}/{path.name}" for path in files]
    started = perf_counter()
    fs.put([str(p) for p in files], targets, chunksize=config.offload_part_bytes,
           max_concurrency=config.offload_upload_concurrency, batch_size=config.offload_concurrency)
    seconds = perf_counter() - started
    fs.rm(f"{s3.BUCKET}/ceiling/r{index}", recursive=True)
    return seconds


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs import StoreConfig, open_store

    at_least_one(args, "size_mib", "rounds")
    size, log = args.size_mib * MiB, sys.stderr
    children = [ColdScanChild(directory / f"cold-scan-{i}.log") for i in range(args.rounds)]  # before the payload
    try:
        payload = make_payload(size, seed=6)
        with s3.s3_server(directory / "s3rver", log) as endpoint:
            config = StoreConfig(data_dir=directory / "data", offload_url=f"s3://{s3.BUCKET}/longterm",
                                 offload_options=endpoint.storage_options(), offload_deletion_lag_s=3600.0)
            uploads: dict[str, list[Throughput]] = {"a": [], "c": []}

            async def offload_rounds() -> None:
                async with open_store(config) as store:
                    for index in range(args.rounds):
                        name = f"bench/r{index}"
                        await store.create(name, durability="vd", make_parents=True)
                        for start in range(0, size, MiB):
                            await store.append(name, payload[start : start + MiB])
                        await store.seal(name)
                        await store.flush(name)
                        files = [config.data_dir / "chunks" / c["name"] for c in await store.chunk_layout(name)]
                        print(f"round {index + 1}/{args.rounds}: {len(files)} chunks", file=log, flush=True)
                        for key in ("c", "a") if index % 2 == 0 else ("a", "c"):
                            seconds = (await offload_s(store, name) if key == "a" else await trio.to_thread.run_sync(
                                ceiling_upload_s, endpoint, files, index, config))
                            uploads[key].append(Throughput("tierfs offload" if key == "a" else "s3fs multipart put",
                                                           size, seconds))

            trio.run(offload_rounds)
            last, read_config = f"bench/r{args.rounds - 1}", config.replace(offload_deletion_lag_s=0.0)

            async def offloaded_layout() -> s3.Layout:
                from tierfs.engine.object_keys import OffloadKeys

                async with open_store(read_config) as store:
                    await offload_s(store, last)  # deletes the due chunk-store copies
                    chunks = await store.chunks_of(store._segment(last))
                    if not all(c.offload_hot_deleted for c in chunks):
                        raise RuntimeError("chunk-store copies were not deleted")
                    for offset in range(0, size, 16 * MiB):
                        if await store.read(last, offset, 16 * MiB) != payload[offset : offset + 16 * MiB]:
                            raise RuntimeError(f"offloaded bytes differ in {offset}..{offset + 16 * MiB}")
                    return [{"url": f"s3://{s3.BUCKET}/longterm/"
                                    f"{OffloadKeys.for_attempt(c.name, c.offload_attempt_uuid).data}",
                             "start": 0, "end": int(c.length)} for c in chunks]

            layout = trio.run(offloaded_layout)
            request = spec(read_config, last, size, offload_url=read_config.offload_url,
                           offload_options=dict(read_config.offload_options))
            reads: dict[str, list[Any]] = {"d": [], "e": [], "bound": [], "gets": []}
            for index, child in enumerate(children):
                print(f"cold read {index + 1}/{args.rounds}: (e), bound, (d) ...", file=log, flush=True)
                reads["e"].append(s3.cat_ranges_ceiling(endpoint.storage_options(), layout, MiB, 16))
                reads["bound"].append(s3.readahead_ceiling(endpoint.storage_options(), layout))
                scan = child.run(request)
                reads["d"].append(scan.throughput)
                reads["gets"].append(scan.cache["gets"])
    finally:
        for child in children:
            child.close()
    return report(args, config, uploads, reads)


def report(args: argparse.Namespace, config: Any, uploads: dict[str, list[Throughput]],
           reads: dict[str, list[Any]]) -> Report:
    offload = table(["round", "(a) tierfs MB/s", "(c) s3fs MB/s", "(a)/(c)"],
                    [[str(i), a.mb_per_s, c.mb_per_s, f"{a.mb_per_s / c.mb_per_s:.3f}"]
                     for i, (a, c) in enumerate(zip(uploads["a"], uploads["c"], strict=True), 1)], digits=0)
    cold = table(["read", "(d) tierfs MB/s", "(e) 1 MiB GETs", "bound", "(d)/(e)", "(d)/bound", "GETs"],
                 [[str(i), d.mb_per_s, e.mb_per_s, b.mb_per_s, f"{d.mb_per_s / e.mb_per_s:.3f}",
                   f"{d.mb_per_s / b.mb_per_s:.3f}", gets] for i, (d, e, b, gets) in
                  enumerate(zip(reads["d"], reads["e"], reads["bound"], reads["gets"], strict=True), 1)], digits=0)
    checks = [Check.over("(a)/(c) offload vs s3fs multipart", ratios(uploads["a"], uploads["c"]), 0.80, True),
              Check.over("(d)/(e) cold read vs raw 1 MiB GETs", ratios(reads["d"], reads["e"]), 0.70, True),
              Check("GETs per MiB of the cold read", max(reads["gets"]) / args.size_mib, 1.0, False)]
    title = (f"offload benchmark: {args.size_mib} MiB segment, s3rver on 127.0.0.1, parts "
             f"{config.offload_part_bytes // MiB} MiB x {config.offload_upload_concurrency} in flight, "
             f"{config.offload_concurrency} chunks at once; bound: {reads['bound'][0].label}")
    return Report(title, [offload, cold], checks, {"uploads": uploads, "reads": reads})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 1024, 3, "store, S3 server data")


def run(args: argparse.Namespace) -> int:
    return run_scenario("offload", args, lambda directory: measure(directory, args))
