"""The storage writer: moves durable journal data into tier-2 chunks in the background.

Stages of the loop, in order (after Pravega's StorageWriter):
1. wait   - until a segment is due or the tick passes;
2. pick   - due segments: >= ``flush_bytes`` pending, oldest pending byte older than
            ``flush_interval_s``, or a flush was requested (seal, sync-to-tier-2,
            shutdown); one flush task per segment at a time;
3. read   - up to ``max_flush_bytes`` of durable bytes from the tail (memory/journal);
            a ``tier2`` segment's flush ends where an append ends and an append that
            does not fit a chunk's room starts a new chunk, so the loss of the host
            never leaves an append cut (unless it alone exceeds a flush or a chunk);
4. write  - confirm this store still owns tier-2 (``OwnerFence.confirm``: one claim
            check), then append to the segment's last chunk if the backend can append,
            the chunk was created by this epoch and is below ``max_chunk_bytes``;
            otherwise a new chunk named from (segment id, epoch, sequence);
5. commit - unless fenced meanwhile: chunk record + segment flushed length in one
            conditional transaction, only after the write returned (the data is durable
            in tier-2);
6. ack    - drop flushed tail entries, then let the journal delete files that hold
            only flushed bytes (checkpoint recorded in metadata first).

Invariants:
- A fenced store (another owner claimed tier-2) flushes nothing and admits no append
  (``check_backlog`` raises ``FencedError``); its unflushed bytes stay in the journal.
- Only durable (LAC) bytes are flushed, so tier-2 never holds bytes a crash could take
  back from the journal.
- A tier-2 failure never blocks appends: the segment retries with exponential backoff
  (``tier2_retry_initial_s`` doubling to ``tier2_retry_max_s``) while appends continue
  until the backlog bound refuses them.
- Blocking tier-2 calls run in worker threads under the store's tier-2 limiter.
- The writer owns the backlog counter (``unflushed_bytes``: appended bytes not yet in
  tier-2): appends add to it through ``appended``, flushes and deletes take from it.
- Append ages, ``retry_at_s`` and the tick are on the engine's monotonic clock
  (``clock.monotonic_s``, the trio run's clock).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

import trio

from tierfs.blocks.checksums import BlockCrcs
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    BacklogFullError,
    ConcurrentModificationError,
    SegmentNotFoundError,
    Tier2Error,
    TierFSError,
)
from tierfs.engine.chunkstore import ChunkStorage
from tierfs.engine.clock import monotonic_s
from tierfs.engine.faults import crash_point
from tierfs.engine.fencing import OwnerFence
from tierfs.engine.metadata import now_ns
from tierfs.engine.object_keys import chunk_name
from tierfs.engine.ports import GarbageSink, JournalFiles
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.tail import TailBudget
from tierfs.engine.tail_reader import TailReader

log = logging.getLogger(__name__)

TICK_S = 0.05  # how often time-based triggers are checked


class FlushCatalogue(Protocol):
    """What the writer needs of the metadata."""

    async def chunks_of(self, seg: SegmentState) -> list[Chunk]: ...

    async def commit_flush(self, seg: SegmentState, record: SegmentMeta, chunk: Chunk) -> None: ...

    async def set_checkpoint(self, lsn: int) -> None: ...


class StorageWriter:
    def __init__(
        self,
        config: StoreConfig,
        epoch: int,
        chunk_storage: ChunkStorage,
        tier2_limiter: trio.CapacityLimiter,
        catalogue: FlushCatalogue,
        tail: TailReader,
        tail_budget: TailBudget,
        journal: JournalFiles,
        garbage: GarbageSink,
        fence: OwnerFence,
    ) -> None:
        self._config = config
        self._epoch = epoch
        self.chunk_storage = chunk_storage
        self._limiter = tier2_limiter
        self._catalogue = catalogue
        self._tail = tail
        self._tail_budget = tail_budget
        self._journal = journal
        self._garbage = garbage
        self._fence = fence
        self.dirty: set[SegmentState] = set()  # segments with unflushed bytes or a request
        self.unflushed_bytes = 0  # appended, not yet in tier-2 (the backlog)
        self._wakeup = trio.Event()
        self.flushes = 0
        self.flushed_bytes = 0
        self.failures = 0
        self.journal_files_deleted = 0

    def wake(self) -> None:
        self._wakeup.set()

    # ------------------------------------------------------------------ the backlog
    def check_backlog(self, size: int) -> None:
        """May ``size`` more bytes enter the backlog: ``FencedError`` once another owner
        claimed tier-2, ``BacklogFullError`` if they would exceed the backlog bound."""
        self._fence.ensure_owner()
        if self.unflushed_bytes + size > self._config.max_backlog_bytes:
            raise BacklogFullError(self.unflushed_bytes + size, self._config.max_backlog_bytes)

    def appended(self, seg: SegmentState, size: int) -> None:
        """``size`` new bytes of ``seg`` are in the journal (or were replayed from it)."""
        self.unflushed_bytes += size
        self.dirty.add(seg)

    def forget(self, seg: SegmentState) -> None:
        """``seg`` was deleted: its unflushed bytes leave the backlog."""
        self.unflushed_bytes -= seg.appended_length - seg.flushed_length
        self.dirty.discard(seg)

    def request_flush(self, seg: SegmentState) -> None:
        """Flush ``seg`` now, whatever the triggers say."""
        seg.flush_requested = True
        seg.retry_at_s = 0.0
        self.dirty.add(seg)
        self.wake()

    async def flush_segments(self, segs: list[SegmentState]) -> None:
        """Wait until tier-2 holds every byte of ``segs`` durable now."""
        targets = [(seg, seg.durable_length) for seg in segs]
        for seg, target in targets:
            while not seg.deleted and seg.flushed_length < target:
                self._fence.ensure_owner()
                self.request_flush(seg)
                with trio.move_on_after(self._fence.check_interval_s) as waiting:  # fenced meanwhile?
                    await seg.flushed_event.wait()
                if waiting.cancelled_caught:
                    continue
                if seg.last_flush_error and seg.flushed_length < target:
                    raise Tier2Error(f"flush of {seg.name!r} failed: {seg.last_flush_error}")

    async def wait_flushed(self, seg: SegmentState, end: int) -> None:
        """``tier2`` durability: return once tier-2 and the metadata hold ``seg``'s bytes
        below ``end``. Group commit: every waiter asks for the next flush of the segment;
        appends that arrive while one runs are written together by the one after it. A
        failing tier-2 keeps its backoff (the waiter waits through it); a deleted
        segment or a fenced store fails the wait."""
        while seg.flushed_length < end:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            self._fence.ensure_owner()
            seg.flush_requested = True
            self.dirty.add(seg)
            self.wake()
            with trio.move_on_after(self._fence.check_interval_s):  # fenced meanwhile?
                await seg.flushed_event.wait()

    async def sync_and_flush(self, segs: list[SegmentState]) -> None:
        """Make every byte appended so far durable, then wait until tier-2 holds the
        bytes of ``segs``."""
        await self._journal.sync()
        await self.flush_segments(segs)

    async def sync_and_flush_one(self, seg: SegmentState) -> None:
        await self.sync_and_flush([seg])

    def flush_lag_s(self) -> float:
        """Age of the oldest append not yet in tier-2."""
        oldest = [t for t in (seg.tail.oldest_append_s() for seg in self.dirty) if t is not None]
        return monotonic_s() - min(oldest) if oldest else 0.0

    # ------------------------------------------------------------------ the loop
    def _is_due(self, seg: SegmentState, now_s: float) -> bool:
        if seg.flushing or seg.deleted or now_s < seg.retry_at_s or self._fence.fenced:
            return False
        pending = seg.durable_length - seg.flushed_length
        if pending <= 0:
            return False
        if seg.flush_requested or pending >= self._config.flush_bytes:
            return True
        oldest = seg.tail.oldest_append_s()
        return oldest is not None and now_s - oldest >= self._config.flush_interval_s

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            await self._truncate_journal()  # files a previous run left fully flushed
            while True:
                with trio.move_on_after(TICK_S):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                now_s = monotonic_s()
                for seg in list(self.dirty):
                    if seg.deleted:
                        self.dirty.discard(seg)
                    elif self._is_due(seg, now_s):
                        seg.flushing = True
                        nursery.start_soon(self._flush_task, seg)

    async def _flush_task(self, seg: SegmentState) -> None:
        # Flush what was due when the task started (everything durable if a flush was
        # requested), then keep going only while a full flush_bytes is pending: a steady
        # trickle of appends is flushed once per flush_interval_s, not after every commit.
        target = seg.durable_length if seg.flush_requested else seg.flushed_length + 1
        seg.flush_requested = False
        try:
            while not seg.deleted and seg.durable_length > seg.flushed_length and (
                seg.flushed_length < target
                or seg.durable_length - seg.flushed_length >= self._config.flush_bytes
            ):
                await self.flush_once(seg)
            seg.backoff_s = 0.0
            seg.last_flush_error = None
            if seg.appended_length == seg.flushed_length:
                self.dirty.discard(seg)
        except TierFSError as e:
            self.failures += 1
            seg.backoff_s = min(
                max(seg.backoff_s * 2, self._config.tier2_retry_initial_s),
                self._config.tier2_retry_max_s,
            )
            seg.retry_at_s = monotonic_s() + seg.backoff_s
            seg.last_flush_error = str(e)
            log.warning(
                "flush of segment %r failed, retrying in %.1f s: %s", seg.name, seg.backoff_s, e
            )
        finally:
            seg.flushing = False
        try:
            await self._truncate_journal()
        except (OSError, TierFSError) as e:
            log.warning("journal truncation failed, will retry after the next flush: %s", e)
        finally:
            seg.notify_flushed()
            if seg.flush_requested:  # asked for during this flush (tier2 appends): next round now
                self.wake()

    async def flush_once(self, seg: SegmentState) -> None:
        config = self._config
        start = seg.flushed_length
        end = min(seg.durable_length, start + config.max_flush_bytes)
        chunks = await self._catalogue.chunks_of(seg)
        last = chunks[-1] if chunks else None
        storage = self.chunk_storage
        grow = (
            storage.supports_append
            and last is not None
            and last.epoch == self._epoch
            and last.location == ""
            and last.offload_attempt_uuid == ""  # never grow a chunk an offload copies
            and last.start_offset + last.length == start
            and last.length < config.max_chunk_bytes
        )
        whole = seg.waits_for_tier2  # a lost host must find whole appends: never cut one
        if grow and whole and last is not None:
            room_end = last.start_offset + config.max_chunk_bytes
            if room_end < end and seg.tail.whole_appends_end(start, room_end) is None:
                grow = False  # the next append does not fit the chunk's room: a new chunk
        if grow and last is not None:
            name = last.name
            chunk_offset = last.length
            end = min(end, last.start_offset + config.max_chunk_bytes)
            crcs = BlockCrcs(last.length, last.crc32c, list(last.block_crc32c))
            new_seq = None
        else:
            new_seq = seg.record.next_chunk_seq
            name = chunk_name(seg.segment_id, self._epoch, new_seq)
            chunk_offset = 0
            end = min(end, start + config.max_chunk_bytes)
            crcs = BlockCrcs()
        if whole:  # cut only an append larger than max_flush_bytes or a chunk
            end = seg.tail.whole_appends_end(start, end) or end
        data = await self._tail.tail_bytes(seg, start, end)
        crcs.extend(data)
        await self._fence.confirm()
        await trio.to_thread.run_sync(
            storage.write, name, chunk_offset, data, limiter=self._limiter
        )
        crash_point("flush.chunk_written")  # in tier-2, not committed: an orphan if we die
        chunk = Chunk(
            name=name,
            segment_id=seg.segment_id,
            start_offset=start - chunk_offset,
            length=crcs.length,
            crc32c=crcs.whole,
            block_crc32c=tuple(crcs.blocks),
            epoch=self._epoch,
            created_ns=last.created_ns if new_seq is None and last is not None else now_ns(),
            location="",
        )
        async with seg.meta_lock:
            if seg.deleted:
                if new_seq is not None:
                    await self._garbage.queue([name])
                return
            # fenced while writing: keep the bytes in the tail (and so in lost+found);
            # the object just written is an orphan of this epoch, never referenced
            self._fence.ensure_owner()
            if new_seq is None and seg.chunks and seg.chunks[-1] is not last:
                # an offload attempt started on the chunk while we wrote: its record
                # wins; the bytes written past its length are never read, and the
                # next flush starts a new chunk
                raise ConcurrentModificationError(
                    f"chunk {name} of {seg.name!r} changed during a flush; retrying"
                )
            record = dataclasses.replace(flushed_times(seg, end), flushed_length=end)
            if new_seq is not None:
                record = dataclasses.replace(
                    record, next_chunk_seq=new_seq + 1, chunk_count=record.chunk_count + 1
                )
            await self._catalogue.commit_flush(seg, record, chunk)
        seg.tail.drop_through(end, self._tail_budget)
        self.unflushed_bytes -= end - start
        self.flushes += 1
        self.flushed_bytes += end - start

    async def _truncate_journal(self) -> None:
        """Delete journal files holding only flushed bytes, checkpoint first."""
        journal = self._journal
        checkpoint = journal.written_lsn
        for seg in self.dirty:
            first = seg.tail.first()
            if first is not None:
                checkpoint = min(checkpoint, first.frame_lsn)
        journal.roll_for_reclaim(checkpoint)  # so flushed bytes go back to the disk
        if journal.file_count() < 2:
            return
        files = journal.deletable_files(checkpoint)
        if not files:
            return
        await self._catalogue.set_checkpoint(checkpoint)
        journal.forget_files(files)
        for path in files:
            await trio.to_thread.run_sync(path.unlink, True)
        self.journal_files_deleted += len(files)


def flushed_times(seg: SegmentState, end: int) -> SegmentMeta:
    """The record with its times as they are once bytes up to ``end`` are flushed:
    mtime (and ctime) move to the time of the append holding byte ``end - 1``, unless
    an explicit set covers it (``mtime_set_length``); the flush itself never moves them."""
    record = seg.record
    if end <= record.mtime_set_length:
        return record
    append_ns = seg.tail.wall_ns_at(end) or now_ns()  # 0: replayed from an old journal
    return dataclasses.replace(record, modified_ns=append_ns, changed_ns=max(record.changed_ns, append_ns))
