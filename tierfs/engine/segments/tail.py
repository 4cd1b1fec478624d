"""The unflushed tail of each segment: appends that are in the journal but not yet in
tier-2, and the memory budget shared by all tails.

Invariants:
- A segment's tail entries are contiguous in segment offsets and ordered; the first one
  may start below the flushed length (partly flushed) and is trimmed on read.
- An entry's bytes are in memory, or (once the shared budget is exceeded and the entry
  has reached the journal file) readable from its journal frame at ``frame_lsn``.
- Memory held by tails never exceeds the budget by more than the frames still queued
  for the next journal write.
- An append larger than the budget's ``keep_max_bytes`` keeps its bytes in memory only
  until its frame is written to the journal file; from then on it is read back from
  the journal (where the page cache already holds it), so its buffer can be reused.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import operator
from collections.abc import Iterator


@dataclasses.dataclass(eq=False, slots=True)  # one per unflushed append: keep it small
class TailEntry:
    offset: int  # segment offset of the first byte
    length: int
    frame_lsn: int  # journal LSN where this append's frame starts
    frame_skip: int  # bytes of the frame's data before this entry (partly flushed frame)
    end_lsn: int  # journal LSN just past the frame
    appended_s: float  # clock.monotonic_s() of the append
    data: bytes | None  # None once evicted to the journal
    wall_ns: int = 0  # wall-clock time of the append (0: unknown, an old journal frame)
    # Recovery merges evicted appends of a segment that follow each other in one journal
    # file (other segments' frames may lie between) into one entry
    # (``Tail.merge_evicted``), so replaying a journal of small appends holds one object
    # per MERGED_ENTRY_MAX_BYTES, not one per append; wall_ns is the last one's.
    frames: int = 1

    @property
    def end(self) -> int:
        return self.offset + self.length


_offset_of = operator.attrgetter("offset")

# An entry recovery merged stays small enough that a flush (4-16 MiB) still finds an
# append boundary within it, and that re-reading it (other segments' frames in between
# included) is one modest pread.
MERGED_ENTRY_MAX_BYTES = 1 << 20
MERGED_SPAN_MAX_BYTES = 4 << 20


class Tail:
    """Unflushed appends of one segment."""

    def __init__(self) -> None:
        self._entries: list[TailEntry] = []
        self._head = 0  # entries before this index were flushed and await compaction

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def add(self, entry: TailEntry) -> None:
        self._entries.append(entry)

    def merge_evicted(self, frame_lsn: int, end_lsn: int, length: int, wall_ns: int) -> bool:
        """Extend the last entry by the frame ``[frame_lsn, end_lsn)`` (``length`` data
        bytes, the next ones of the segment) if it is evicted, the frame comes after it
        in the same journal file (the caller checks the file) and the entry stays within
        its bounds; whether it did."""
        if len(self) == 0:
            return False
        last = self._entries[-1]
        if (last.data is not None or last.end_lsn > frame_lsn or end_lsn - last.frame_lsn > MERGED_SPAN_MAX_BYTES
                or last.length + length > MERGED_ENTRY_MAX_BYTES):
            return False
        last.length += length
        last.end_lsn = end_lsn
        last.frames += 1
        last.wall_ns = wall_ns
        return True

    def last(self) -> TailEntry | None:
        return self._entries[-1] if self._head < len(self._entries) else None

    def first(self) -> TailEntry | None:
        return self._entries[self._head] if self._head < len(self._entries) else None

    def drop_through(self, flushed_length: int, budget: TailBudget) -> None:
        """Forget entries wholly below ``flushed_length`` (per entry: runs on the event
        loop after every flush, for every append it carried)."""
        entries = self._entries
        head = self._head
        count = len(entries)
        while head < count:
            entry = entries[head]
            if entry.offset + entry.length > flushed_length:
                break
            if entry.data is not None:
                budget.release(entry)
            head += 1
        self._head = head
        if head > 1024 and head * 2 > len(entries):
            del entries[:head]
            self._head = 0

    def clear(self, budget: TailBudget) -> None:
        for entry in self._entries[self._head :]:
            budget.release(entry)
        self._entries = []
        self._head = 0

    def _from(self, start: int) -> Iterator[TailEntry]:
        """The entries from the one holding byte ``start`` (or the first after it) on."""
        index = bisect.bisect_right(self._entries, start, lo=self._head, key=_offset_of) - 1
        return itertools.islice(self._entries, max(index, self._head), None)

    def pieces(self, start: int, end: int) -> list[tuple[TailEntry, int, int]]:
        """Entries overlapping [start, end) as (entry, from, to) in entry-relative bytes
        (per entry: a flush takes every append it carries this way, on the event loop)."""
        result: list[tuple[TailEntry, int, int]] = []
        add = result.append
        for entry in self._from(start):
            offset = entry.offset
            if offset >= end:
                break
            length = entry.length
            lo = start - offset if start > offset else 0
            hi = end - offset if end - offset < length else length
            if hi > lo:
                add((entry, lo, hi))
        return result

    def joined(self, start: int, end: int) -> bytes | None:
        """The bytes of [start, end) joined, in one pass, when every entry overlapping it
        is still in memory; None as soon as one was evicted (``pieces`` then)."""
        parts: list[bytes] = []
        add = parts.append
        for entry in self._from(start):
            offset, data = entry.offset, entry.data
            if offset >= end:
                break
            if data is None:
                return None
            if offset >= start and offset + entry.length <= end:
                add(data)  # the usual case: a whole append
            else:
                add(data[max(start - offset, 0) : end - offset])
        return b"".join(parts)

    def whole_appends_end(self, start: int, end: int) -> int | None:
        """The last end of an append in (``start``, ``end``] (``end`` itself when it is
        one); None when the append at ``start`` runs past ``end``."""
        entries = self._entries
        index = bisect.bisect_right(entries, end - 1, lo=self._head, key=_offset_of) - 1
        if index >= self._head and entries[index].end > end:
            return entries[index].offset if entries[index].offset > start else None
        return end

    def wall_ns_at(self, end: int) -> int:
        """Wall-clock time of the append holding byte ``end - 1`` (0: not in the tail
        or unknown): the mtime of a segment whose durable length is ``end``."""
        entries = self._entries
        index = bisect.bisect_right(entries, end - 1, lo=self._head, key=_offset_of) - 1
        if index < self._head or entries[index].end < end:
            return 0
        return entries[index].wall_ns

    def oldest_append_s(self) -> float | None:
        entry = self.first()
        return entry.appended_s if entry else None


class TailBudget:
    """Bytes of tail data held in memory by all segments, evicting oldest first.

    Large entries (over ``keep_max_bytes``) are released as soon as they are written:
    holding each appender's fresh buffer would cost a page fault per 4 KiB of it, while a
    released buffer is reused by the allocator for the next append (and the bytes would
    otherwise be in memory twice, here and in the journal file's page cache).
    """

    def __init__(self, limit_bytes: int, keep_max_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.keep_max_bytes = keep_max_bytes
        self.used_bytes = 0
        self.evicted_entries = 0  # dropped to stay within limit_bytes
        self.released_large_entries = 0  # dropped because larger than keep_max_bytes
        self._held_entries = 0
        self._fifo: collections.deque[TailEntry] = collections.deque()
        self._large: collections.deque[TailEntry] = collections.deque()

    @property
    def over(self) -> bool:
        """True while ``evict`` has something to do once the journal is written."""
        return self.used_bytes > self.limit_bytes or bool(self._large)

    def hold(self, entry: TailEntry) -> None:
        assert entry.data is not None
        self.used_bytes += entry.length
        self._held_entries += 1
        self._fifo.append(entry)
        if entry.length > self.keep_max_bytes:
            self._large.append(entry)
        if len(self._fifo) > 4 * self._held_entries + 1024:
            # Released entries pile up behind an old held one: keep the FIFO (and so
            # memory) proportional to what is actually held.
            self._fifo = collections.deque(e for e in self._fifo if e.data is not None)

    def release(self, entry: TailEntry) -> None:
        if entry.data is not None:
            entry.data = None
            self.used_bytes -= entry.length
            self._held_entries -= 1

    def evict(self, written_lsn: int) -> None:
        """Drop in-memory bytes of large entries and of the oldest entries, of those
        already written to the journal."""
        large = self._large
        while large and (large[0].data is None or large[0].end_lsn <= written_lsn):
            entry = large.popleft()
            if entry.data is not None:  # else released meanwhile (flushed, deleted)
                self.release(entry)
                self.released_large_entries += 1
        fifo = self._fifo
        while self.used_bytes > self.limit_bytes and fifo:
            entry = fifo[0]
            if entry.data is None:
                fifo.popleft()
                continue
            if entry.end_lsn > written_lsn:
                break  # still queued for the journal: the only copy is in memory
            fifo.popleft()
            self.release(entry)
            self.evicted_entries += 1
        while fifo and fifo[0].data is None:
            fifo.popleft()
