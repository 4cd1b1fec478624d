"""The storage writer: moves durable journal data into tier-2 chunks in the background.

Stages of the loop, in order (after Pravega's StorageWriter):
1. wait   - until woken (a flush requested or finished, ``flush_bytes`` reached) or
            the tick passes; a tick before the time a segment can come due by age
            alone does nothing more;
2. pick   - due segments: >= ``flush_bytes`` pending, oldest pending byte older than
            ``flush_interval_s``, or a flush was requested (seal, sync-to-tier-2,
            shutdown); one flush at a time per segment. Segments with less than
            ``flush_bytes`` pending (a trickle, or many small files) are flushed
            together, up to ``max_flush_bytes`` and ``MAX_BATCH_SEGMENTS`` per batch,
            and join a batch early once half their interval passed
            (``JOIN_AFTER_FRACTION``); a segment with more gets a task of its own that
            keeps flushing while ``flush_bytes`` are pending;
3. flush  - ``flush.batch.ChunkFlusher``: plan each segment's piece (``flush.plan``),
            write it, verify ownership with a claim check that started after the
            writes, commit every piece of the batch in one metadata transaction;
4. ack    - drop flushed tail entries, then let the journal delete files that hold
            only flushed bytes (checkpoint recorded in metadata first; once per batch).

Invariants:
- A fenced store (another owner claimed tier-2) flushes nothing and admits no append
  (``check_backlog`` raises ``FencedError``); its unflushed bytes stay in the journal.
- Only durable (LAC) bytes are flushed, so tier-2 never holds bytes a crash could take
  back from the journal.
- A tier-2 failure never blocks appends: the segment retries with exponential backoff
  (``tier2_retry_initial_s`` doubling to ``tier2_retry_max_s``) while appends continue
  until the backlog bound refuses them.
- Blocking tier-2 calls run in worker threads under the store's tier-2 limiter.
- A flush waiter (a close's flush, a ``tier2`` append, ``sync``) fails with
  ``Tier2Error`` once the loop has ended, within the fence's check interval: a store
  whose writer failed closes without waiting for flushes that cannot come.
- The writer owns the backlog counter (``unflushed_bytes``: appended bytes not yet in
  tier-2): appends add to it through ``appended``, flushes and deletes take from it.
- Append ages, ``retry_at_s`` and the tick are on the engine's monotonic clock
  (``clock.monotonic_s``, the trio run's clock).
- A pass over the dirty segments runs when the loop is woken or when one can have come
  due by age (``_next_pass_s``); the loop sleeps until then. Every other trigger wakes
  it (a requested flush, ``flush_bytes`` reached, a finished flush), and a segment that
  turns dirty after a pass comes due no sooner than a flush interval after it, which is
  when the next pass comes at the latest: an idle store's loop wakes once a flush
  interval. A pass grows with the dirty segments, a batch with its segments, never
  with the store.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    BacklogFullError,
    SegmentNotFoundError,
    Tier2Error,
    TierFSError,
)
from tierfs.engine.clock import monotonic_s
from tierfs.engine.flush.batch import ChunkFlusher, FlushOutcome
from tierfs.engine.flush.batch import FlushCatalogue as PieceCatalogue
from tierfs.engine.ownership.fencing import OwnerFence
from tierfs.engine.ports import GarbageSink, JournalFiles
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail import TailBudget
from tierfs.engine.segments.tail_reader import TailReader
from tierfs.engine.tier2.chunk_storage import ChunkStorage

log = logging.getLogger(__name__)

TICK_S = 0.05  # the shortest sleep between passes that nothing woke
# Segments per batch: one transaction of this many rows stays short (a few ms), and
# so does the time each segment's meta_lock is held for it.
MAX_BATCH_SEGMENTS = 512
# A small segment whose oldest unflushed append is this share of flush_interval_s old
# joins a batch that goes anyway: batches (a claim check, a PUT and a commit each) come
# about twice per interval rather than at every tick, and no append waits longer.
JOIN_AFTER_FRACTION = 0.5


class FlushCatalogue(PieceCatalogue, Protocol):
    """What the writer needs of the metadata."""

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
        self.chunk_storage = chunk_storage  # tests swap it on an open store
        self._catalogue = catalogue
        self._tail_budget = tail_budget
        self._journal = journal
        self._fence = fence
        self._flusher = ChunkFlusher(config, epoch, tier2_limiter, catalogue, tail, garbage, fence)
        self.packs_in_flight = self._flusher.packs_in_flight  # for the orphan sweep
        self.dirty: set[SegmentState] = set()  # segments with unflushed bytes or a request
        self.unflushed_bytes = 0  # appended, not yet in tier-2 (the backlog)
        self._wakeup = trio.Event()
        self._next_pass_s = 0.0  # the loop's next pass over the dirty segments (``_pass``)
        self.flushes = 0
        self.flushed_bytes = 0
        self.batches = 0  # flushes of many small segments together
        self.failures = 0
        self.journal_files_deleted = 0
        self.running = False  # the loop (``run``) is running: flush waiters can be served
        # called after a commit of a tier2 segment's flush: the metadata backup takes it soon
        # awaited before journal files are deleted (SQLite: the metadata changes that
        # flushed their bytes reach tier-2 first, so a restore never misses them)
        self.before_journal_delete: Callable[[], Awaitable[None]] = _nothing

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
        for seg, target in targets:  # all at once: small ones are flushed in shared batches
            if seg.flushed_length < target:
                self.request_flush(seg)
        for seg, target in targets:
            while not seg.deleted and seg.flushed_length < target:
                self._fence.ensure_owner()
                self._ensure_running()
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
            self._ensure_running()
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
    def _is_due(self, seg: SegmentState, now_s: float, age_s: float) -> bool:
        """Whether ``seg`` may be flushed now: a flush was requested, ``flush_bytes``
        are pending, or its oldest unflushed append is ``age_s`` old."""
        if seg.flushing or seg.deleted or now_s < seg.retry_at_s or self._fence.fenced:
            return False
        pending = seg.durable_length - seg.flushed_length
        if pending <= 0:
            return False
        if seg.flush_requested or pending >= self._config.flush_bytes:
            return True
        oldest = seg.tail.oldest_append_s()
        return oldest is not None and now_s - oldest >= age_s

    @property
    def flush_commits(self) -> int:
        """Metadata transactions that committed flushes (a batch is one)."""
        return self._flusher.commits

    @property
    def packs(self) -> int:
        """Pack objects written (many segments' small chunks in one object)."""
        return self._flusher.packs

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                await self._truncate_journal()  # files a previous run left fully flushed
                while True:
                    # asleep until the next pass can come due (at most a flush interval ahead)
                    with trio.move_on_at(max(self._next_pass_s, monotonic_s() + TICK_S)):
                        await self._wakeup.wait()
                    woken = self._wakeup.is_set()
                    self._wakeup = trio.Event()
                    now_s = monotonic_s()
                    if woken or now_s >= self._next_pass_s:
                        self._pass(nursery, now_s)
        finally:
            self.running = False

    def _ensure_running(self) -> None:
        """A flush waiter's check: the loop ended (the store failed or is closing), so
        nothing it waits for will come."""
        if not self.running:
            raise Tier2Error("the storage writer has stopped")

    def _pass(self, nursery: trio.Nursery, now_s: float) -> None:
        """One pass over the dirty segments: start the flushes that are due, and note
        when the next one can come due by age alone (``_next_pass_s``), so that ticks
        before it cost nothing whatever the number of dirty segments. Only a due segment
        starts a batch (the early ones join it), so that time is the oldest pending
        append's plus ``flush_interval_s``; a segment that turns dirty after the pass
        appends no sooner than now. A requested flush, a segment reaching
        ``flush_bytes`` and a finished flush wake the loop instead."""
        interval_s = self._config.flush_interval_s
        join_after_s = interval_s * JOIN_AFTER_FRACTION
        next_pass_s = now_s + interval_s
        due_small: list[SegmentState] = []
        early: list[SegmentState] = []
        for seg in list(self.dirty):
            if seg.deleted:
                self.dirty.discard(seg)
                continue
            if self._is_due(seg, now_s, interval_s):
                if seg.durable_length - seg.flushed_length >= self._config.flush_bytes:
                    seg.flushing = True
                    nursery.start_soon(self._flush_task, seg)
                else:
                    due_small.append(seg)
                continue
            if self._is_due(seg, now_s, join_after_s):
                early.append(seg)  # flushed now only if a due segment starts a batch
            oldest = seg.tail.oldest_append_s()
            if oldest is not None:
                next_pass_s = min(next_pass_s, oldest + interval_s)
            if seg.retry_at_s > now_s:
                next_pass_s = min(next_pass_s, seg.retry_at_s)
        self._next_pass_s = next_pass_s
        if due_small:
            self._start_batches(nursery, due_small + early)

    def _start_batches(self, nursery: trio.Nursery, segs: list[SegmentState]) -> None:
        """Flush ``segs`` (each with less than ``flush_bytes`` pending) in batches of at
        most ``MAX_BATCH_SEGMENTS`` segments and ``max_flush_bytes``."""
        batch: list[SegmentState] = []
        batch_bytes = 0
        for seg in segs:
            seg.flushing = True
            pending = seg.durable_length - seg.flushed_length
            if batch and (len(batch) == MAX_BATCH_SEGMENTS or batch_bytes + pending > self._config.max_flush_bytes):
                nursery.start_soon(self._batch_task, batch)
                batch, batch_bytes = [], 0
            batch.append(seg)
            batch_bytes += pending
        nursery.start_soon(self._batch_task, batch)

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
            self._succeeded(seg)
        except TierFSError as e:
            self._failed(seg, e)
        finally:
            seg.flushing = False
        await self._after_flushes([seg])

    async def _batch_task(self, segs: list[SegmentState]) -> None:
        """One piece of each of ``segs`` (small pending ranges), committed together; a
        segment with more left after it (a requested flush past a chunk's room) is
        picked again at the next tick."""
        targets = {seg: seg.durable_length for seg in segs if seg.flush_requested}
        for seg in segs:
            seg.flush_requested = False
        try:
            outcome = await self._flush(segs)
            self.batches += 1
        except TierFSError as e:
            outcome = FlushOutcome(failed={seg: e for seg in segs})
        finally:
            for seg in segs:
                seg.flushing = False
        for seg in segs:
            error = outcome.failed.get(seg)
            if error is not None:
                self._failed(seg, error)
                continue
            self._succeeded(seg)
            if seg in targets and not seg.deleted and seg.flushed_length < targets[seg]:
                seg.flush_requested = True  # asked for more than one piece: next round
        await self._after_flushes(segs)

    def _succeeded(self, seg: SegmentState) -> None:
        seg.backoff_s = 0.0
        seg.last_flush_error = None
        if seg.appended_length == seg.flushed_length:
            self.dirty.discard(seg)

    def _failed(self, seg: SegmentState, error: TierFSError) -> None:
        self.failures += 1
        seg.backoff_s = min(
            max(seg.backoff_s * 2, self._config.tier2_retry_initial_s),
            self._config.tier2_retry_max_s,
        )
        seg.retry_at_s = monotonic_s() + seg.backoff_s
        seg.last_flush_error = str(error)
        log.warning(
            "flush of segment %r failed, retrying in %.1f s: %s", seg.name, seg.backoff_s, error
        )

    async def _after_flushes(self, segs: list[SegmentState]) -> None:
        try:
            await self._truncate_journal()
        except (OSError, TierFSError) as e:
            log.warning("journal truncation failed, will retry after the next flush: %s", e)
        finally:
            for seg in segs:
                seg.notify_flushed()
            # a pass now: what was appended during the flush, or asked for then (tier2
            # appends), may be due before the time the last pass noted
            self.wake()

    async def flush_once(self, seg: SegmentState) -> None:
        """Flush the next piece of ``seg`` (its flush slot held by the caller)."""
        failed = (await self._flush([seg])).failed.get(seg)
        if failed is not None:
            raise failed

    async def _flush(self, segs: list[SegmentState]) -> FlushOutcome:
        outcome = await self._flusher.flush(segs, self.chunk_storage)
        for piece in outcome.committed:
            piece.seg.tail.drop_through(piece.end, self._tail_budget)
            self.unflushed_bytes -= piece.end - piece.start
            self.flushes += 1
            self.flushed_bytes += piece.end - piece.start
        return outcome

    def _flushed_checkpoint(self) -> int:
        """The journal LSN below which every frame is flushed (or needs no replay)."""
        checkpoint = self._journal.written_lsn
        for seg in self.dirty:
            first = seg.tail.first()
            if first is not None:
                checkpoint = min(checkpoint, first.frame_lsn)
        return checkpoint

    async def checkpoint_flushed(self) -> None:
        """At a clean shutdown, after the last flush: record how far the journal is
        flushed (a synced commit, so every unsynced one before it is durable too). The
        next open then replays nothing flushed and has no checkpoint of its own to
        commit, so its metadata backup can stay current (``backup.seal``). A refusal
        (fenced, the metadata failing) is logged: the next open replays more, nothing
        is lost."""
        try:
            await self._catalogue.set_checkpoint(self._flushed_checkpoint())
        except TierFSError as e:
            log.warning("shutdown: journal checkpoint not recorded: %s", e)

    async def _truncate_journal(self) -> None:
        """Delete journal files holding only flushed bytes, checkpoint first."""
        journal = self._journal
        checkpoint = self._flushed_checkpoint()
        journal.roll_for_reclaim(checkpoint)  # so flushed bytes go back to the disk
        if journal.file_count() < 2:
            return
        files = journal.deletable_files(checkpoint)
        if not files:
            return
        await self._catalogue.set_checkpoint(checkpoint)
        await self.before_journal_delete()
        journal.forget_files(files)
        for path in files:
            await trio.to_thread.run_sync(path.unlink, True)
        self.journal_files_deleted += len(files)


async def _nothing() -> None:
    await trio.lowlevel.checkpoint()
