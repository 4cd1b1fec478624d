"""Writer marks: which appends of which writers a segment holds, so an append sent
again after a lost answer is answered with the offset it landed at (exactly once by
identity, never by comparing bytes: two writers may append identical bytes).

Per segment, per writer, the last ``MARKS_PER_WRITER`` appends: (sequence number,
offset, length, end LSN of its journal frame). They are made when an append's frame is
queued (``Appender``), rebuilt from the journal's frames by recovery, and kept in the
segment record by every flush commit (``FlushPiece.record``: the last flushed append of
the ``PERSISTED_WRITERS`` most recent writers), so they survive a restart and reach the
next owner of a container with the metadata.

Invariants:
- A mark is made only for an append whose frame is queued: one that was refused made
  none, so sending it again appends it.
- A persisted mark covers bytes below the flushed length only: a retry answered from
  the metadata names bytes tier-2 holds, also after the loss of the journal.
- Memory is bounded: at most ``MAX_WRITERS`` writers per segment (the least recently
  appending goes first) and ``MARKS_PER_WRITER`` marks each.
"""

from __future__ import annotations

import dataclasses

from tierfs.engine.record_types import SegmentMeta

MARKS_PER_WRITER = 4  # a pipelining writer resends up to its depth (2) of older appends
MAX_WRITERS = 4096  # writers remembered per segment: retries come within seconds
PERSISTED_WRITERS = 64  # in the segment record (about 20 bytes each)


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    seq: int
    offset: int
    length: int
    end_lsn: int  # the journal frame's end (0: durable already, replayed or flushed)

    @property
    def end(self) -> int:
        return self.offset + self.length


class WriterMarks:
    """One segment's marks (see the module docstring)."""

    def __init__(self) -> None:
        self._by_writer: dict[int, list[Mark]] = {}  # least recently appending first

    @classmethod
    def from_record(cls, record: SegmentMeta) -> WriterMarks:
        marks = cls()
        for writer, seq, offset, length in zip(record.append_writers, record.append_writer_seqs,
                                               record.append_writer_offsets, record.append_writer_lengths,
                                               strict=True):
            marks.record(writer, seq, offset, length, 0)
        return marks

    def find(self, writer: int, seq: int) -> Mark | None:
        for mark in self._by_writer.get(writer, ()):
            if mark.seq == seq:
                return mark
        return None

    def last_seq(self, writer: int) -> int | None:
        marks = self._by_writer.get(writer)
        return marks[-1].seq if marks else None

    def record(self, writer: int, seq: int, offset: int, length: int, end_lsn: int) -> None:
        marks = self._by_writer.pop(writer, None) or []
        if not marks or marks[-1].seq < seq:
            marks.append(Mark(seq, offset, length, end_lsn))
        elif all(m.seq != seq for m in marks):  # recovery: frames after the record's mark
            marks.append(Mark(seq, offset, length, end_lsn))
            marks.sort(key=lambda m: m.seq)
        del marks[:-MARKS_PER_WRITER]
        self._by_writer[writer] = marks
        if len(self._by_writer) > MAX_WRITERS:
            del self._by_writer[next(iter(self._by_writer))]

    def all_marks(self) -> list[tuple[int, Mark]]:
        """(writer, mark) of every mark kept."""
        return [(writer, mark) for writer, marks in self._by_writer.items() for mark in marks]

    def persisted(self, record: SegmentMeta, flushed_end: int) -> SegmentMeta:
        """``record`` for a flush that commits bytes up to ``flushed_end``: with the
        last mark below it of the most recent writers, oldest first."""
        kept: list[tuple[int, Mark]] = []
        for writer in reversed(self._by_writer):
            below = [m for m in self._by_writer[writer] if m.end <= flushed_end]
            if below:
                kept.append((writer, below[-1]))
                if len(kept) == PERSISTED_WRITERS:
                    break
        kept.reverse()
        return dataclasses.replace(
            record,
            append_writers=tuple(w for w, _ in kept),
            append_writer_seqs=tuple(m.seq for _, m in kept),
            append_writer_offsets=tuple(m.offset for _, m in kept),
            append_writer_lengths=tuple(m.length for _, m in kept),
        )
