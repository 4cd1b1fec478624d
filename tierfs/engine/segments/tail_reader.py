"""Reading a segment's unflushed tail: bytes still in memory, or re-read from their
journal frames (CRC-checked) once the tail's memory budget let them go.

Invariants:
- ``capture`` is synchronous: together with the flushed length read in the same step,
  it pins exactly which bytes come from the tail, so a flush that completes meanwhile
  cannot make a byte disappear or appear twice.
- Evicted entries are re-read from the journal together, in one worker-thread call;
  the journal checks each frame's CRC32C.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import trio

from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail import TailEntry

TailPart = bytes | tuple[TailEntry, int, int]


class JournalReads(Protocol):
    def read_entries(self, entries: Sequence[TailEntry]) -> list[bytes]: ...


class TailReader:
    def __init__(self, journal: JournalReads) -> None:
        self._journal = journal

    def capture(self, seg: SegmentState, start: int, end: int) -> list[TailPart]:
        """Synchronously take the tail's bytes for [start, end): in-memory slices, or
        references to entries that must be re-read from the journal."""
        parts: list[TailPart] = []
        covered = 0
        if end <= start:
            return parts
        for entry, lo, hi in seg.tail.pieces(start, end):
            parts.append(entry.data[lo:hi] if entry.data is not None else (entry, lo, hi))
            covered += hi - lo
        if covered != end - start:
            raise AssertionError(f"tail of {seg.name!r} does not cover {start}..{end}")
        return parts

    async def resolve(self, parts: list[TailPart]) -> list[bytes]:
        """Turn captured tail parts into bytes."""
        evicted = [part for part in parts if not isinstance(part, bytes)]
        if not evicted:
            return [part for part in parts if isinstance(part, bytes)]
        reread = await trio.to_thread.run_sync(
            self._journal.read_entries, [entry for entry, _, _ in evicted]
        )
        by_entry = iter(reread)
        pieces = []
        for part in parts:
            if isinstance(part, bytes):
                pieces.append(part)
            else:
                _, lo, hi = part
                pieces.append(next(by_entry)[lo:hi])
        return pieces

    async def tail_bytes(self, seg: SegmentState, start: int, end: int) -> bytes:
        """The tail's bytes of [start, end) (a flush takes its piece this way)."""
        if end > start:
            joined = seg.tail.joined(start, end)  # one pass while nothing was evicted
            if joined is not None:
                if len(joined) != end - start:
                    raise AssertionError(f"tail of {seg.name!r} does not cover {start}..{end}")
                return joined
        return b"".join(await self.resolve(self.capture(seg, start, end)))
