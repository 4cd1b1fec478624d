"""The append path: one append becomes one journal frame, one tail entry, and an
acknowledgement once its durability level allows; durable lengths (LAC) advance as the
journal reports synced LSNs.

Where an append goes, in order: check it (size, expected offset, sealed, backlog);
frame it into the journal (``AppendLog.add_append``: the offset is assigned here,
synchronously); keep it in the segment's tail (memory bounded by ``TailBudget``); count
it in the storage writer's backlog; then PD waits for the fdatasync covering its frame,
VD only for the write(2). ``on_durable`` (the journal's callback) advances each
segment's durable length, wakes tail readers and growth listeners, and wakes the
storage writer when a segment has ``flush_bytes`` pending.

The appender is on ports (``ports``): the journal as an ``AppendLog``, the storage
writer as a ``FlushBacklog``, the tenure as an ``AckGate``.

An append with a writer identity (``WriterSeq``) that the segment already holds (its
``segments.writer_marks``) is not appended again: it is answered with its offset once the
acknowledgement rule holds for it, as the first attempt would have been.

Invariants:
- An append is acknowledged only while this store may still be the owner (``Tenure``:
  not fenced, and in cluster mode the container's lease valid with a margin), checked
  when its acknowledgement rule is met, right before the answer; otherwise it is
  refused (``FencedError``, ``LeaseLapsedError``) and the writer sends it again with
  the same identity.
- While the lease is lapsed the durable length does not advance: readers are never
  shown bytes another owner may not have. It catches up when the lease is renewed.
- Appends to one segment get offsets in call order and never interleave.
- An identified append lands at most once: its mark is made in the same step as its
  frame, before anything can await.
- A segment's durable length advances only to the end of an append whose frame is
  covered by a completed fdatasync (LAC): readers never see bytes a crash can take away.
- A refused append changes nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from time import monotonic, time_ns

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    AlreadyAppendedError,
    AppendTooLargeError,
    BadOffsetError,
    InvalidArgumentError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.contracts.writers import WriterSeq
from tierfs.engine.clock import monotonic_s
from tierfs.engine.ports import AckGate, AppendLog, FlushBacklog
from tierfs.engine.segments.growth import GrowthNotifier
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail import TailBudget, TailEntry

checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled

# A VD appender in a tight loop still lets other tasks run: it yields once this much real
# time has passed since its last yield. Timed on time.monotonic(), not the engine's
# clock.monotonic_s: a test's mock clock stands still while tasks run, so it would stop
# the yields.
YIELD_EVERY_S = 0.0002


class Appender:
    def __init__(self, config: StoreConfig, tail_budget: TailBudget, growth: GrowthNotifier) -> None:
        self._config = config
        self._max_append_bytes = config.max_append_bytes  # read on every append
        self._tail_budget = tail_budget
        self._growth = growth
        # (end LSN of a frame, its segment, the segment length after it), in LSN order
        self._awaiting_durable: deque[tuple[int, SegmentState, int]] = deque()
        self._last_yield_s = 0.0
        self.appends = 0
        self.appended_bytes = 0
        # The journal is built with ``on_durable`` as its callback, so the appender
        # exists first; the journal and the writer are attached once they do.
        self._journal: AppendLog | None = None
        self._writer: FlushBacklog | None = None
        self._tenure: AckGate | None = None
        self._held_lsn = 0  # synced while the lease was lapsed: shown once it is renewed
        # SQLite metadata: ships the metadata changes to tier-2 (a tier2 acknowledgement
        # promises a restore finds the bytes); None with PostgreSQL
        self.ship_metadata: Callable[[], Awaitable[None]] | None = None
        self._monotonic_s = monotonic_s

    def attach(self, journal: AppendLog, writer: FlushBacklog, tenure: AckGate) -> None:
        """Called on the event loop once the journal and the writer exist."""
        self._journal = journal
        self._writer = writer
        self._tenure = tenure
        if tenure.lease is not None:
            tenure.lease.on_regained.append(self._show_held)
        # The run's clock (``clock.monotonic_s``) as one bound method: it is read on
        # every append, and the module-level lookup costs three calls instead of one.
        self._monotonic_s = trio.lowlevel.current_clock().current_time

    async def append(
        self, seg: SegmentState, data: bytes | bytearray | memoryview, expected_offset: int | None,
        writer: WriterSeq | None = None,
    ) -> int:
        """Append ``data`` to ``seg`` as one atomic record; returns its offset."""
        journal, storage_writer, tenure = self._journal, self._writer, self._tenure
        assert journal is not None and storage_writer is not None and tenure is not None
        if type(data) is bytes:  # the usual case: no copy, no further check
            payload = data
        elif isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
        else:
            raise InvalidArgumentError(f"append data must be bytes, not {type(data).__name__}")
        size = len(payload)
        if size > self._max_append_bytes:
            raise AppendTooLargeError(size, self._max_append_bytes)
        if expected_offset is not None and (
            not isinstance(expected_offset, int) or expected_offset < 0
        ):
            raise InvalidArgumentError(f"expected_offset must be an int >= 0, not {expected_offset!r}")
        while seg.merge_done is not None:
            await seg.merge_done.wait()  # a concat into this segment is committing
        if seg.deleted:
            raise SegmentNotFoundError(seg.name)
        if writer is not None:
            mark = seg.writer_marks.find(writer.writer, writer.seq)
            if mark is not None:
                return await self._landed(seg, writer, mark.offset, mark.length, mark.end_lsn, size)
            last = seg.writer_marks.last_seq(writer.writer)
            if last is not None and writer.seq < last:
                raise AlreadyAppendedError(seg.name, writer.writer_hex, writer.seq, last)
        if seg.sealed:
            raise SegmentSealedError(seg.name)
        offset = seg.appended_length
        if expected_offset is not None and expected_offset != offset:
            raise BadOffsetError(seg.name, expected_offset, offset)
        if size == 0:
            await trio.lowlevel.checkpoint()
            return offset
        tenure.check(seg.name)  # a lapsed lease refuses before anything changed
        storage_writer.check_backlog(size)
        wall_ns = time_ns()  # the segment's mtime once durable (kept in the frame)
        if writer is None:
            frame_lsn, end_lsn = journal.add_append(seg.segment_id, offset, payload, wall_ns)
        else:
            frame_lsn, end_lsn = journal.add_append(seg.segment_id, offset, payload, wall_ns,
                                                    writer.writer, writer.seq)
            seg.writer_marks.record(writer.writer, writer.seq, offset, size, end_lsn)
        end = offset + size
        seg.appended_length = end
        now_s = self._monotonic_s()
        seg.last_append_s = now_s
        entry = TailEntry(offset, size, frame_lsn, 0, end_lsn, now_s, payload, wall_ns)
        seg.tail.add(entry)
        self._tail_budget.hold(entry)
        storage_writer.appended(seg, size)
        self.appends += 1
        self.appended_bytes += size
        self._awaiting_durable.append((end_lsn, seg, end))
        if seg.is_pd:
            await journal.wait_durable(end_lsn)
            if seg.waits_for_tier2:
                await storage_writer.wait_flushed(seg, end)
                if self.ship_metadata is not None:
                    await self.ship_metadata()
            tenure.check(seg.name)
            return offset
        await journal.wait_written(end_lsn)  # at once; on a full disk, once space is back
        if self._tail_budget.over:
            self._tail_budget.evict(journal.written_lsn)
        real_now_s = monotonic()
        if real_now_s - self._last_yield_s >= YIELD_EVERY_S:
            self._last_yield_s = real_now_s
            await trio.lowlevel.checkpoint()
        else:
            await checkpoint_if_cancelled()
        tenure.check(seg.name)
        return offset

    async def _landed(self, seg: SegmentState, writer: WriterSeq, offset: int, length: int, end_lsn: int,
                      size: int) -> int:
        """An identified append the segment holds already: its offset, once it is
        acknowledged by the rule of the segment's durability level."""
        journal, storage_writer, tenure = self._journal, self._writer, self._tenure
        assert journal is not None and storage_writer is not None and tenure is not None
        if length != size:
            raise InvalidArgumentError(f"{writer} already appended {length} bytes to {seg.name!r} at {offset}, "
                                       f"not {size}: a writer sequence number names one append")
        if seg.is_pd:
            if end_lsn:
                await journal.wait_durable(end_lsn)
            if seg.waits_for_tier2:
                await storage_writer.wait_flushed(seg, offset + length)
                if self.ship_metadata is not None:
                    await self.ship_metadata()
        elif end_lsn > journal.written_lsn:
            await journal.wait_written(end_lsn)  # still queued: a stalled journal
        else:
            await trio.lowlevel.checkpoint()
        tenure.check(seg.name)
        return offset

    def on_durable(self, lsn: int) -> None:
        """Journal callback: advance LAC of every segment whose frames are now synced
        (held back while the lease is lapsed)."""
        journal, writer, tenure = self._journal, self._writer, self._tenure
        assert journal is not None and writer is not None and tenure is not None
        lease = tenure.lease
        if lease is not None and not lease.valid():
            self._held_lsn = max(self._held_lsn, lsn)
            return
        awaiting = self._awaiting_durable
        grown: set[SegmentState] = set()
        while awaiting and awaiting[0][0] <= lsn:
            _, seg, end = awaiting.popleft()
            if end > seg.durable_length:
                seg.durable_length = end
                grown.add(seg)
        flush_bytes = self._config.flush_bytes
        for seg in grown:
            seg.notify_grew()
            self._growth.notify(seg)
            if seg.durable_length - seg.flushed_length >= flush_bytes:
                writer.wake()
        if self._tail_budget.over:
            self._tail_budget.evict(journal.written_lsn)

    def _show_held(self) -> None:
        """The lease is valid again: what was synced meanwhile becomes durable."""
        if self._held_lsn:
            held, self._held_lsn = self._held_lsn, 0
            self.on_durable(held)
