"""fsck: verify every chunk's bytes and the metadata invariants of an open store.

Checks, per segment: chunk records are contiguous from the segment's start offset
(0 unless retention deleted head chunks) up to the flushed length; ``chunk_count``
matches; every chunk object exists (in the chunk store, or in the long-term store once
offloaded, with an index object that matches the record) and is at least as long as
its committed length; every 1 MiB block and the whole chunk match their CRC32C; the
lengths obey flushed <= durable <= appended. Every ``lost+found`` entry (acknowledged bytes
a fenced store could not commit to tier-2: engine/lost_found.py) is reported too, until
someone recovers and removes it. Reads use the storage directly, bypassing
the cache, so a cached copy cannot hide damage. The report's types are in
``contracts.fsck_report`` (clients read them without the engine).
"""

from __future__ import annotations

from typing import Protocol

import trio

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import TierFSError
from tierfs.contracts.fsck_report import FsckReport, Problem
from tierfs.engine.catalogue import ChunkCatalogue
from tierfs.engine.chunkstore import ChunkStorage
from tierfs.engine.lost_found import LostFoundEntry, entries
from tierfs.engine.segment_table import SegmentTable
from tierfs.offload.offloader import require_long_term
from tierfs.offload.reads import LongTermReads
from tierfs.store import listing


class FsckTarget(Protocol):
    """What fsck reads of an open store (``SegmentStore`` has it)."""

    config: StoreConfig
    table: SegmentTable
    catalogue: ChunkCatalogue
    long_term_reads: LongTermReads | None
    tier2_limiter: trio.CapacityLimiter

    @property
    def chunk_storage(self) -> ChunkStorage: ...


def require_long_term_reads(reads: LongTermReads | None) -> LongTermReads:
    require_long_term(None if reads is None else reads.long_term)
    assert reads is not None
    return reads


async def fsck(store: FsckTarget) -> FsckReport:
    problems: list[Problem] = []
    chunk_total = checked = 0
    infos = await listing.walk_segments(store.table)
    for info in infos:
        seg = store.table.segment(info.name)
        if not info.flushed_length <= info.durable_length <= info.appended_length:
            problems.append(Problem(info.name, "", "lengths out of order"))
        chunks = await store.catalogue.chunks_of(seg)
        chunk_total += len(chunks)
        if len(chunks) != info.chunk_count:
            problems.append(
                Problem(info.name, "", f"chunk_count {info.chunk_count} but {len(chunks)} chunk records")
            )
        expected_start = info.start_offset
        for chunk in chunks:
            if chunk.start_offset != expected_start:
                problems.append(
                    Problem(info.name, chunk.name, f"starts at {chunk.start_offset}, expected {expected_start}")
                )
            expected_start = chunk.start_offset + chunk.length
            try:
                storage, key = store.chunk_storage, chunk.name
                if chunk.location:
                    reads = require_long_term_reads(store.long_term_reads)
                    storage, key = reads.long_term.storage, reads.long_term.key_of(chunk.location)
                    await reads.index_of(chunk, cached=False)
                size = await trio.to_thread.run_sync(storage.stat, key, limiter=store.tier2_limiter)
            except TierFSError as e:
                problems.append(Problem(info.name, chunk.name, str(e)))
                continue
            if size < chunk.length:
                problems.append(
                    Problem(info.name, chunk.name, f"object holds {size} bytes, metadata says {chunk.length}")
                )
                continue
            whole = 0
            for block, expected_crc in enumerate(chunk.block_crc32c):
                start = block * BLOCK_BYTES
                end = min(start + BLOCK_BYTES, chunk.length)
                data = await trio.to_thread.run_sync(
                    storage.read, key, start, end, limiter=store.tier2_limiter
                )
                checked += len(data)
                whole = crc32c(data, whole)
                if crc32c(data) != expected_crc:
                    problems.append(
                        Problem(info.name, chunk.name, f"block {block} (bytes {start}..{end}) fails its CRC32C")
                    )
            if whole != chunk.crc32c:
                problems.append(Problem(info.name, chunk.name, "whole-chunk CRC32C mismatch"))
        if expected_start != info.flushed_length:
            problems.append(
                Problem(info.name, "", f"chunks end at {expected_start}, flushed length is {info.flushed_length}")
            )
    for entry in await trio.to_thread.run_sync(entries, store.config.data_dir):
        problems.append(_lost_found_problem(entry))
    return FsckReport(len(infos), chunk_total, checked, problems)


def _lost_found_problem(entry: LostFoundEntry) -> Problem:
    facts = entry.description
    if facts is None:
        return Problem("", entry.path, f"{entry.size} bytes in lost+found without a description")
    return Problem(
        str(facts.get("segment", "")), entry.path,
        f"lost+found: {facts.get('bytes')} acknowledged bytes (offsets {facts.get('start_offset')}"
        f"..{facts.get('end_offset')}) of epoch {facts.get('epoch')} never reached tier-2: "
        "another owner took it over; recover them from this file, then remove it",
    )
