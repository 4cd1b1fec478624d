"""Defrag (Pravega PDP-34): runs of small adjacent chunks become one large chunk.

Slow segments flushed often leave many small chunk objects (on object stores every
flush is a new object). ``Defragmenter.defrag(seg)`` merges each planned run
(``upkeep.defrag_plan.merge_runs``) in four steps:

1. name   - a fresh chunk name ``s<id>/e<epoch>-c<seq>``: the sequence number is
            committed (``next_chunk_seq`` + 1) while the segment's flush slot
            (``SegmentState.flushing``) is held, so no flush can pick the same number;
            the name is put in ``merging`` (the intent the orphan sweep honours)
            before the merged object is written, and taken out only once the swap
            committed it or it was queued as garbage;
2. merge  - ``ChunkStorage.merge``: natively where tier-2 can (``copy_file_range``
            locally, S3 multipart ``UploadPartCopy`` for parts >= 5 MiB), else read +
            write; a run holding chunks packed with other segments' (the storage
            writer's batches) is read from the packs and written; the sources are
            never changed;
3. verify - the new object is read back: every old 1 MiB block is checked against its
            recorded CRC32C, and the new per-1 MiB-block CRC32Cs are computed from the
            same bytes;
4. swap   - under the segment's ``meta_lock``, one metadata transaction replaces the
            old chunk records by the new one, conditional on the segment revision and
            on each old record being stored unchanged; the cached chunk list is
            replaced by a new list in one step. The old objects are queued as garbage
            in the same transaction, collectable after ``offload_deletion_lag_s`` (the
            store's deletion lag).

A crash before the swap leaves the merged object unreferenced (its sequence number is
never used again; an orphan for the orphan GC); a crash after it leaves the old
objects in the garbage queue, collected after the restart.

A run whose chunks changed meanwhile (a flush grew one, an offload attempt started,
retention, concat or rm) is skipped: its merged object is queued as garbage and the
segment is left as it was.

Invariants:
- A reader sees the old chunks or the merged one, never a gap: bytes and offsets are
  the same, the list is swapped atomically, and a read that still holds the old list
  when an old object is deleted resolves again (``Reader.read_chunks``).
- Every merged byte was verified against the old chunks' CRCs before the swap.
- Offloaded chunks and chunks with an offload attempt are never merged.
- The background pass (every ``defrag_interval_s``; 0 = never) merges runs of chunks
  below ``defrag_small_chunk_bytes`` in segments holding more than
  ``defrag_min_small_chunks`` of them; ``defrag`` on demand merges every run of chunks
  below ``max_chunk_bytes``. Merged chunks never exceed ``max_chunk_bytes``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import trio

from tierfs.blocks.checksums import BLOCK_BYTES, BlockCrcs
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import ConcurrentModificationError, DataCorruptionError, TierFSError
from tierfs.engine.clock import now_ns
from tierfs.engine.faults import crash_point
from tierfs.engine.object_keys import chunk_name, is_pack_name
from tierfs.engine.ports import GarbageSink
from tierfs.engine.record_types import Chunk, SegmentMeta, SegmentRow
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.engine.tier2.s3_merge import MergeCounts
from tierfs.engine.upkeep.defrag_plan import merge_runs, small_chunk_count

log = logging.getLogger(__name__)

VERIFY_PIECE_BYTES = 8 << 20  # read-back piece: 8 ranged reads per 64 MiB chunk, bounded memory
# Merged-away objects wait for their deletion lag in the garbage queue; the collector is
# woken this often too, so those queued before a restart are collected after it.
GARBAGE_RECHECK_S = 600.0


class DefragCatalogue(Protocol):
    """What defrag needs of the metadata."""

    async def chunks_of(self, seg: SegmentState) -> list[Chunk]: ...

    async def update_record(self, seg: SegmentState, **fields: Any) -> None: ...

    async def replace_chunks(
        self, seg: SegmentState, record: SegmentMeta, old: list[Chunk], merged: Chunk, collect_after_ns: int
    ) -> None: ...


@dataclasses.dataclass
class DefragResult:
    """What one ``defrag`` of a segment did."""

    path: str
    chunks_before: int = 0
    chunks_after: int = 0
    runs_merged: int = 0
    runs_skipped: int = 0  # chunks changed meanwhile: left as they were
    chunks_merged: int = 0
    copied_natively_bytes: int = 0
    rewritten_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rewrite_run(storage: ChunkStorage, name: str, run: Sequence[Chunk]) -> MergeCounts:
    """Chunk ``name`` from the bytes of ``run``, read where each is (a chunk packed with
    others starts at its ``object_offset``) and written at once (blocking; in memory:
    a run never exceeds ``max_chunk_bytes``). Verified afterwards like any merge."""
    data = b"".join(storage.read(c.name, c.object_offset, c.object_offset + c.length) for c in run)
    storage.write(name, 0, data)
    return MergeCounts(rewritten_bytes=len(data))


def verify_merged(storage: ChunkStorage, name: str, old: Sequence[Chunk]) -> BlockCrcs:
    """Read the merged object ``name`` back (blocking), check each old chunk's 1 MiB
    blocks against their recorded CRC32Cs, and return the new object's CRCs."""
    expected = [
        (
            min(chunk.length - block * BLOCK_BYTES, BLOCK_BYTES),
            crc,
            BlockAddress(f"merged chunk {name} (from {chunk.name})", block, chunk.start_offset + block * BLOCK_BYTES),
        )
        for chunk in old
        for block, crc in enumerate(chunk.block_crc32c)
    ]
    total_bytes = sum(chunk.length for chunk in old)
    crcs = BlockCrcs()
    pending = bytearray()
    next_block = 0
    position = 0
    while position < total_bytes:
        piece = storage.read(name, position, min(total_bytes, position + VERIFY_PIECE_BYTES))
        if not piece:
            raise DataCorruptionError(f"merged chunk {name} ends after {position} of {total_bytes} bytes")
        crcs.extend(piece)
        pending += piece
        position += len(piece)
        used = 0
        while next_block < len(expected) and len(pending) - used >= expected[next_block][0]:
            length, crc, address = expected[next_block]
            verified_block(bytes(pending[used : used + length]), length, crc, address, "the merged chunk")
            used += length
            next_block += 1
        del pending[:used]
    if next_block != len(expected) or crcs.length != total_bytes:
        raise DataCorruptionError(f"merged chunk {name} does not cover its {len(old)} chunks")
    return crcs


class Defragmenter:
    def __init__(
        self,
        config: StoreConfig,
        epoch: int,
        chunk_storage: ChunkStorage,
        tier2_limiter: trio.CapacityLimiter,
        catalogue: DefragCatalogue,
        garbage: GarbageSink,
        wake_writer: Callable[[], None],
        walk: Callable[[], Iterator[SegmentState | SegmentRow]],
        segment_by_id: Callable[[int], SegmentState | None],
    ) -> None:
        self._config = config
        self._epoch = epoch
        self.chunk_storage = chunk_storage
        self._limiter = tier2_limiter
        self._catalogue = catalogue
        self._garbage = garbage
        self._wake_writer = wake_writer
        self._walk = walk
        self._segment_by_id = segment_by_id
        self._nursery: trio.Nursery | None = None
        self._wakeup = trio.Event()
        # merged objects written or being written, not yet committed nor queued: an
        # orphan sweep never deletes them (their sequence is below next_chunk_seq)
        self.merging: set[str] = set()
        self.runs_merged = 0
        self.chunks_merged = 0

    def wake(self) -> None:
        """Run a background pass now (tests)."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The background pass, every ``defrag_interval_s`` (never if 0); also wakes the
        garbage collector every ``GARBAGE_RECHECK_S`` for merged-away objects whose
        deletion lag has passed."""
        interval_s = self._config.defrag_interval_s or float("inf")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            next_scan_s = trio.current_time() + interval_s
            while True:
                with trio.move_on_at(min(next_scan_s, trio.current_time() + GARBAGE_RECHECK_S)):
                    await self._wakeup.wait()
                self._garbage.collect_soon()
                if self._wakeup.is_set() or trio.current_time() >= next_scan_s:
                    self._wakeup = trio.Event()
                    next_scan_s = trio.current_time() + interval_s
                    try:
                        await self.scan()
                    except TierFSError as e:  # the metadata database away: the next pass
                        log.warning("defrag pass stopped, retried in %.0f s: %s", interval_s, e)

    async def scan(self) -> None:
        """One background pass over every segment; only those whose records count more
        chunks than a merge needs get their chunk lists loaded."""
        config = self._config
        for found in self._walk():
            if found.record.chunk_count <= config.defrag_min_small_chunks:
                continue
            seg = self._segment_by_id(found.segment_id) if isinstance(found, SegmentRow) else found
            if seg is None or seg.deleted:
                continue
            try:
                chunks = await self._catalogue.chunks_of(seg)
                if small_chunk_count(chunks, config.defrag_small_chunk_bytes) > config.defrag_min_small_chunks:
                    await self.defrag(seg, small_bytes=config.defrag_small_chunk_bytes)
            except TierFSError as e:  # one segment's failure does not stop the pass
                log.warning("defrag of %r failed, will retry on the next pass: %s", seg.name, e)

    async def defrag(self, seg: SegmentState, *, small_bytes: int | None = None) -> DefragResult:
        """Merge the segment's runs of chunks below ``small_bytes`` (default: every chunk
        below ``max_chunk_bytes``)."""
        config = self._config
        chunks = await self._catalogue.chunks_of(seg)
        result = DefragResult(seg.name, chunks_before=len(chunks))
        include_last = seg.record.sealed and seg.flushed_length == seg.durable_length
        runs = merge_runs(
            chunks, small_bytes or config.max_chunk_bytes, config.max_chunk_bytes, include_last=include_last
        )
        for first, end in runs:
            if seg.deleted:
                break
            counts = await self._merge_run(seg, chunks[first:end])
            if counts is None:
                result.runs_skipped += 1
                continue
            result.runs_merged += 1
            result.chunks_merged += end - first
            result.copied_natively_bytes += counts.copied_natively_bytes
            result.rewritten_bytes += counts.rewritten_bytes
        result.chunks_after = len(seg.chunks or [])
        self.runs_merged += result.runs_merged
        self.chunks_merged += result.chunks_merged
        if result.runs_merged:
            self._collect_after(config.offload_deletion_lag_s)
        return result

    async def _reserve_chunk_seq(self, seg: SegmentState) -> int:
        """A sequence number no flush can use: the storage writer reads
        ``next_chunk_seq`` only while it holds ``seg.flushing``, so the number is taken
        and committed while defrag holds that flag."""
        while seg.flushing:
            await seg.flushed_event.wait()
        seg.flushing = True
        try:
            async with seg.meta_lock:
                seq = seg.record.next_chunk_seq
                await self._catalogue.update_record(seg, next_chunk_seq=seq + 1)
        finally:
            seg.flushing = False
            self._wake_writer()
        return seq

    async def _merge_run(self, seg: SegmentState, run: list[Chunk]) -> MergeCounts | None:
        """Merge one run; None if its chunks changed meanwhile (nothing changed)."""
        try:
            seq = await self._reserve_chunk_seq(seg)
        except ConcurrentModificationError:
            return None  # deleted or changed meanwhile
        name = chunk_name(seg.segment_id, self._epoch, seq)
        self.merging.add(name)
        try:
            return await self._write_and_swap(seg, run, name)
        finally:
            self.merging.discard(name)

    async def _write_and_swap(self, seg: SegmentState, run: list[Chunk], name: str) -> MergeCounts | None:
        storage = self.chunk_storage
        try:
            if any(c.object_offset or is_pack_name(c.name) for c in run):
                counts = await trio.to_thread.run_sync(rewrite_run, storage, name, run, limiter=self._limiter)
            else:
                counts = await trio.to_thread.run_sync(
                    storage.merge, name, [(c.name, c.length) for c in run], limiter=self._limiter
                )
            crcs = await trio.to_thread.run_sync(verify_merged, storage, name, run, limiter=self._limiter)
        except Exception:
            await self._garbage.queue([name])
            if seg.deleted or not _holds_run(seg.chunks or [], run):
                return None  # its sources went away with their records (rm, retention)
            raise
        merged = Chunk(
            name=name, segment_id=seg.segment_id, start_offset=run[0].start_offset,
            length=crcs.length, crc32c=crcs.whole, block_crc32c=tuple(crcs.blocks),
            epoch=self._epoch,
            # the first old chunk's: the chunk before it stays sealed as of when it was
            # (offload_after_s), and retention ages are unchanged
            created_ns=run[0].created_ns,
        )
        crash_point("defrag.merged")
        lag_s = self._config.offload_deletion_lag_s
        async with seg.meta_lock:
            if seg.deleted or not _holds_run(seg.chunks or [], run):
                await self._garbage.queue([name])
                return None
            record = dataclasses.replace(
                seg.record, chunk_count=seg.record.chunk_count - len(run) + 1
            )
            try:
                await self._catalogue.replace_chunks(seg, record, run, merged, now_ns() + int(lag_s * 1e9))
            except ConcurrentModificationError:
                await self._garbage.queue([name])
                return None
        crash_point("defrag.swapped")
        if lag_s <= 0:
            self._garbage.collect_soon()
        return counts

    def _collect_after(self, lag_s: float) -> None:
        """Wake the collector once the objects this call queued may go (one timer per
        ``defrag`` call; after a restart the periodic wake-up in ``run`` does it)."""
        if lag_s > 0 and self._nursery is not None:
            self._nursery.start_soon(self._sleep_then_collect, lag_s)

    async def _sleep_then_collect(self, lag_s: float) -> None:
        await trio.sleep(lag_s + 1.0)  # the garbage stamp is wall-clock ns: a second's slack
        self._garbage.collect_soon()


def _holds_run(chunks: Sequence[Chunk], run: Sequence[Chunk]) -> bool:
    """``run`` appears unchanged and adjacent in ``chunks``."""
    try:
        first = chunks.index(run[0])
    except ValueError:
        return False
    return list(chunks[first : first + len(run)]) == list(run)
