"""fsck: verify every chunk's bytes and the metadata invariants of an open store.

Checks, per segment: chunk records are contiguous from the segment's start offset
(0 unless retention deleted head chunks) up to the flushed length; ``chunk_count``
matches; every chunk object exists (in the chunk store, or in the long-term store once
offloaded, with an index object that matches the record) and is at least as long as
its committed length; every 1 MiB block and the whole chunk match their CRC32C; the
lengths obey flushed <= durable <= appended. Every ``lost+found`` entry (acknowledged bytes
a fenced store could not commit to tier-2: engine/recovery/lost_found.py) is reported too, until
someone recovers and removes it. Reads use the storage directly, bypassing
the cache, so a cached copy cannot hide damage. They retry like every tier-2 read
(``tier2.chunk_storage``: deadlines, 8 attempts); a store that still does not answer fails
fsck with that ``Tier2Error`` (exit 1), never a report of damage it could not see; so
does a store that has offloaded chunks but no long-term store configured to read them.
Orphans (objects no metadata references, whatever their age: ``engine/upkeep/orphans.py``)
are listed apart, not as damage. The report's types are in
``contracts.fsck_report`` (clients read them without the engine).

Invariant: fsck runs beside appends, flushes and offloads and never reports damage that
is not there. Each segment's lengths and chunk list are taken at one moment
(``_snapshot``); a chunk whose object fails a check is reported only if the segment
still holds that very record afterwards (a flush that grew it, an offload that moved it,
a defrag that merged it, retention or a delete that dropped it are no damage), whichever
read found it: its stat, or a block read after the collector deleted it. A deleted
segment is skipped.
"""

from __future__ import annotations

from typing import Protocol

import trio

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import ChunkMissingError, InvalidArgumentError, Tier2Error, TierFSError
from tierfs.contracts.reports.fsck import FsckReport, Problem
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.engine.record_types import Chunk
from tierfs.engine.recovery.lost_found import LostFoundEntry, entries
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.engine.upkeep.orphans import OrphanSweeper
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
    orphans: OrphanSweeper

    @property
    def chunk_storage(self) -> ChunkStorage: ...


def require_long_term_reads(reads: LongTermReads | None) -> LongTermReads:
    require_long_term(None if reads is None else reads.long_term)
    assert reads is not None
    return reads


def _snapshot(seg: SegmentState) -> tuple[SegmentInfo, list[Chunk]]:
    """The segment's info and chunk list at one moment: no await between the two, and
    both are replaced (never mutated) by commits, so they agree with each other."""
    assert seg.chunks is not None
    return listing.segment_info(seg), seg.chunks


def _still_holds(seg: SegmentState, chunk: Chunk) -> bool:
    """True while ``chunk`` is still the segment's record at its offset: a chunk replaced
    (grown, offloaded, truncated) or a segment deleted while fsck read it is no damage."""
    return not seg.deleted and seg.chunks is not None and chunk in seg.chunks


async def _check_chunk(store: FsckTarget, name: str, chunk: Chunk) -> tuple[list[Problem], int]:
    """Problems of one chunk object against its record, and the bytes read."""
    checked = 0
    place = chunk.object_offset  # where the chunk starts in its object (a pack), tier-2 only
    if chunk.location and store.long_term_reads is None:  # not damage: nothing to check it with
        raise InvalidArgumentError(
            f"{name!r} has chunks offloaded to {chunk.location}: run fsck with --offload-to URL "
            "(the long-term store) to check them"
        )
    try:
        storage, key = store.chunk_storage, chunk.name
        if chunk.location:
            reads = require_long_term_reads(store.long_term_reads)
            storage, key = reads.long_term.storage, reads.long_term.key_of(chunk.location)
            place = 0  # the long-term copy holds the chunk alone
            await reads.index_of(chunk, cached=False)
        size = await trio.to_thread.run_sync(storage.stat, key, limiter=store.tier2_limiter)
    except ChunkMissingError as e:
        return [Problem(name, chunk.name, str(e))], checked
    except Tier2Error:  # no answer after every retry: no verdict on the data
        raise
    except TierFSError as e:
        return [Problem(name, chunk.name, str(e))], checked
    if size < place + chunk.length:
        return [Problem(name, chunk.name, f"object holds {size} bytes, metadata says {place} + {chunk.length}")], checked
    problems: list[Problem] = []
    whole = 0
    for block, expected_crc in enumerate(chunk.block_crc32c):
        start = block * BLOCK_BYTES
        end = min(start + BLOCK_BYTES, chunk.length)
        try:
            data = await trio.to_thread.run_sync(
                storage.read, key, place + start, place + end, limiter=store.tier2_limiter)
        except ChunkMissingError as e:  # gone since its stat: merged or deleted with its record (or damage)
            return [*problems, Problem(name, chunk.name, str(e))], checked
        checked += len(data)
        whole = crc32c(data, whole)
        if crc32c(data) != expected_crc:
            problems.append(Problem(name, chunk.name, f"block {block} (bytes {start}..{end}) fails its CRC32C"))
    if whole != chunk.crc32c:
        problems.append(Problem(name, chunk.name, "whole-chunk CRC32C mismatch"))
    return problems, checked


def _layout_problems(info: SegmentInfo, chunks: list[Chunk]) -> list[Problem]:
    """The metadata invariants of one snapshot: lengths in order, chunks contiguous from
    the start offset to the flushed length, and as many as the record counts."""
    problems = []
    if not info.flushed_length <= info.durable_length <= info.appended_length:
        problems.append(Problem(info.name, "", "lengths out of order"))
    if len(chunks) != info.chunk_count:
        problems.append(Problem(info.name, "", f"chunk_count {info.chunk_count} but {len(chunks)} chunk records"))
    expected_start = info.start_offset
    for chunk in chunks:
        if chunk.start_offset != expected_start:
            problems.append(Problem(info.name, chunk.name, f"starts at {chunk.start_offset}, expected {expected_start}"))
        expected_start = chunk.start_offset + chunk.length
    if expected_start != info.flushed_length:
        problems.append(
            Problem(info.name, "", f"chunks end at {expected_start}, flushed length is {info.flushed_length}")
        )
    return problems


async def fsck(store: FsckTarget) -> FsckReport:
    problems: list[Problem] = []
    segment_total = chunk_total = checked = 0
    await trio.lowlevel.checkpoint()
    for entry_found in store.table.walk():
        seg = (entry_found if isinstance(entry_found, SegmentState)
               else store.table.segment_by_id(entry_found.segment_id))
        if seg is None:
            continue  # deleted since the walk's batch was read
        await store.catalogue.chunks_of(seg)
        if seg.deleted:
            continue
        info, chunks = _snapshot(seg)
        segment_total += 1
        chunk_total += len(chunks)
        problems += _layout_problems(info, chunks)
        for chunk in chunks:
            found, read_bytes = await _check_chunk(store, info.name, chunk)
            checked += read_bytes
            if found and _still_holds(seg, chunk):
                problems += found
    for entry in await trio.to_thread.run_sync(entries, store.config.data_dir):
        problems.append(_lost_found_problem(entry))
    orphans = await store.orphans.unreferenced()
    return FsckReport(segment_total, chunk_total, checked, problems, orphans)


def _lost_found_problem(entry: LostFoundEntry) -> Problem:
    facts = entry.description
    if facts is None:
        return Problem("", entry.path, f"{entry.size} bytes in lost+found without a description")
    return Problem(
        entry.segment, entry.path,
        f"lost+found: {entry.line()} (tierfs lost-found restore {entry.path} appends them again)",
    )
