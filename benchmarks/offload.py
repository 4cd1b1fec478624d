"""Offload benchmark: tierfs offloading a segment to S3 (s3rver) next to s3fs uploading the
same chunk files with tierfs's parallelism, and cold reads after offload.

The chunk store is local, the long-term store ``s3://tierfs-bench/longterm``. Each of
``--rounds`` (3), the order of (a) and (c) alternating: a new segment of ``--size-mib``
(1024) MiB by 1 MiB VD appends, sealed and flushed (64 MiB chunk files); (c) s3fs ``put``
of those files with ``offload_part_bytes`` parts, ``offload_upload_concurrency`` parts
and ``offload_concurrency`` files at once; (a) ``store.offload`` until SUCCESS (per
chunk: attempt recorded, chunk read and checked, data and index objects uploaded,
completion recorded). Then the last segment's local copies are deleted (its bytes
checked) and per round (d) a fresh process (``harness.cold_scan``) reads it from the
long-term store, right after (e) s3fs 1 MiB ranges, 16 in flight, and the read-ahead
bound. Targets: (a)/(c) >= 0.80 (issue 6); (d)/(e) >= 0.70; GETs <= bytes / 1 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import s3
from benchmarks.harness.cold_scan import ColdScanChild, spec
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, ratios
from benchmarks.harness.scenario import Report, alternate, rounds_table, say, size_rounds
from tierfs import StoreConfig, open_store
from tierfs.engine.object_keys import OffloadKeys

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


async def offload_rounds(config: Any, endpoint: s3.S3Endpoint, payload: bytes, rounds: int
                         ) -> dict[str, list[Throughput]]:
    """(a) and (c) per round, each on a new segment."""
    uploads: dict[str, list[Throughput]] = {"(a)": [], "(c)": []}
    async with open_store(config) as store:
        for index in range(rounds):
            name = f"bench/r{index}"
            await store.create(name, durability="vd", make_parents=True)
            for start in range(0, len(payload), MiB):
                await store.append(name, payload[start : start + MiB])
            await store.seal(name)
            await store.flush(name)
            files = [config.data_dir / "chunks" / c["name"] for c in await store.chunk_layout(name)]
            say(f"round {index + 1}/{rounds}: {len(files)} chunks")
            for key in alternate(index, ["(c)", "(a)"]):
                seconds = (await offload_s(store, name) if key == "(a)" else await trio.to_thread.run_sync(
                    ceiling_upload_s, endpoint, files, index, config))
                uploads[key].append(Throughput(key, len(payload), seconds))
    return uploads


async def offloaded_layout(config: Any, name: str, payload: bytes) -> s3.Layout:
    """Offload again with deletion lag 0 (local copies deleted), bytes checked: the objects' layout."""
    async with open_store(config) as store:
        await offload_s(store, name)
        chunks = await store.chunks_of(store._segment(name))
        if not all(c.offload_hot_deleted for c in chunks):
            raise RuntimeError("chunk-store copies were not deleted")
        for offset in range(0, len(payload), 16 * MiB):
            if await store.read(name, offset, 16 * MiB) != payload[offset : offset + 16 * MiB]:
                raise RuntimeError(f"offloaded bytes differ in {offset}..{offset + 16 * MiB}")
        return [{"url": f"s3://{s3.BUCKET}/longterm/{OffloadKeys.for_attempt(c.name, c.offload_attempt_uuid).data}",
                 "start": 0, "end": int(c.length)} for c in chunks]


def measure(directory: Path, args: argparse.Namespace) -> Report:
    size = args.size_mib * MiB
    with contextlib.ExitStack() as stack:
        children = [stack.enter_context(ColdScanChild(directory / f"cold-scan-{i}.log"))  # before the payload
                    for i in range(args.rounds)]
        payload = make_payload(size, seed=6)
        endpoint = stack.enter_context(s3.s3_server(directory / "s3rver"))
        options = endpoint.storage_options()
        config = StoreConfig(data_dir=directory / "data", offload_url=f"s3://{s3.BUCKET}/longterm",
                             offload_options=options, offload_deletion_lag_s=3600.0)
        uploads = trio.run(offload_rounds, config, endpoint, payload, args.rounds)
        last, read_config = f"bench/r{args.rounds - 1}", config.replace(offload_deletion_lag_s=0.0)
        layout = trio.run(offloaded_layout, read_config, last, payload)
        request = spec(read_config, last, size, offload_url=read_config.offload_url, offload_options=dict(options))
        reads: dict[str, list[Any]] = {"(d)": [], "(e)": [], "bound": [], "gets": []}
        for index, child in enumerate(children):
            say(f"cold read {index + 1}/{args.rounds}: (e), bound, (d) ...")
            reads["(e)"].append(s3.cat_ranges_ceiling(options, layout, MiB, 16))
            reads["bound"].append(s3.readahead_ceiling(options, layout))
            scan = child.run(request)
            reads["(d)"].append(scan.throughput)
            reads["gets"].append(scan.cache["gets"])
    checks = [Check.over("(a)/(c) offload vs s3fs multipart", ratios(uploads["(a)"], uploads["(c)"]), 0.80, True),
              Check.over("(d)/(e) cold read vs raw 1 MiB GETs", ratios(reads["(d)"], reads["(e)"]), 0.70, True),
              Check("GETs per MiB of the cold read", max(reads["gets"]) / args.size_mib, 1.0, False)]
    title = (f"offload benchmark: {args.size_mib} MiB segment, s3rver on 127.0.0.1, parts "
             f"{config.offload_part_bytes // MiB} MiB x {config.offload_upload_concurrency} in flight, "
             f"{config.offload_concurrency} chunks at once")
    legend = ["(a) tierfs offload, (c) s3fs multipart put; after the offload: (d) tierfs cold read, (e) s3fs 1 MiB "
              f"ranges, 16 in flight, bound: {reads['bound'][0].label}; GETs of (d): {reads['gets']}"]
    sections = [legend, rounds_table(uploads, [("(a)", "(c)")], 0),
                rounds_table({k: reads[k] for k in ("(d)", "(e)", "bound")}, [("(d)", "(e)"), ("(d)", "bound")], 0)]
    return Report(title, sections, checks, {"uploads": uploads, "reads": reads})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size_rounds(parser, 1024, 3)
