"""In-memory state of one open segment: the write-through copy of its metadata row,
its lengths (appended LAP, durable LAC, flushed), its unflushed tail and its chunk list.

Invariants:
- ``flushed_length <= durable_length <= appended_length``.
- ``row.record`` and chunk records are frozen values (``record_types``), replaced,
  never mutated, so a reader holding an old record sees a consistent snapshot.
- ``chunks`` (once loaded) equals the metadata's chunk records in offset order.
"""

from __future__ import annotations

import bisect
import dataclasses

import trio

from tierfs.engine.record_types import Chunk, SegmentMeta, SegmentRow
from tierfs.engine.segments.tail import Tail
from tierfs.engine.segments.writer_marks import WriterMarks


@dataclasses.dataclass(eq=False)
class SegmentState:
    _row: SegmentRow
    appended_length: int
    durable_length: int
    tail: Tail = dataclasses.field(default_factory=Tail)
    chunks: list[Chunk] | None = None  # loaded lazily
    chunk_starts: list[int] = dataclasses.field(default_factory=list)
    meta_lock: trio.Lock = dataclasses.field(default_factory=trio.Lock)
    deleted: bool = False
    holds: int = 0  # descriptors holding the segment (``store.holds``): deleting it detaches it
    sealing: bool = False
    # set while a concat into this segment commits: appends wait for it (see store.concat)
    merge_done: trio.Event | None = None
    last_append_s: float | None = None  # clock.monotonic_s() of the last append
    # storage writer bookkeeping
    flushing: bool = False
    flush_requested: bool = False
    retry_at_s: float = 0.0
    backoff_s: float = 0.0
    last_flush_error: str | None = None
    flushed_event: trio.Event = dataclasses.field(default_factory=trio.Event)
    # tail readers wait on this; replaced each time the durable length advances
    grew_event: trio.Event = dataclasses.field(default_factory=trio.Event)

    # Flags read on every append, cached from the record whenever the row is replaced.
    is_pd: bool = True  # journal-synced before the acknowledgement (pd and tier2)
    waits_for_tier2: bool = False  # acknowledged once flushed and committed (tier2)
    _sealed_record: bool = False
    # the row's id, read several times an append (a plain attribute: a property costs a call)
    segment_id: int = dataclasses.field(init=False, default=0)
    # exactly-once marks of identified appends, made from the record when first needed
    marks: WriterMarks | None = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        self.row = self._row

    @property
    def row(self) -> SegmentRow:
        return self._row

    @row.setter
    def row(self, row: SegmentRow) -> None:
        self._row = row
        self.segment_id = row.segment_id
        self.is_pd = row.record.durability in ("pd", "tier2")
        self.waits_for_tier2 = row.record.durability == "tier2"
        self._sealed_record = row.record.sealed

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def record(self) -> SegmentMeta:
        return self.row.record

    @property
    def flushed_length(self) -> int:
        return self.row.record.flushed_length

    @property
    def start_offset(self) -> int:
        """First readable byte: retention deleted everything below it."""
        return self.row.record.start_offset

    @property
    def sealed(self) -> bool:
        return self._sealed_record or self.sealing

    @property
    def durability(self) -> str:
        return self.row.record.durability

    def times_ns(self) -> tuple[int, int]:
        """(mtime, ctime) in wall-clock ns. mtime: the time of the last append within the
        durable length, unless a flush committed it (then the record holds it) or an
        explicit set covers it (``mtime_set_length``); read, never recomputed from a
        clock, so every stat of an unchanged segment answers the same."""
        record = self.row.record
        durable = self.durable_length
        if durable > record.flushed_length and durable > record.mtime_set_length:
            append_ns = self.tail.wall_ns_at(durable)
            if append_ns:
                return append_ns, max(record.changed_ns, append_ns)
        return record.modified_ns, record.changed_ns or record.modified_ns

    @property
    def writer_marks(self) -> WriterMarks:
        if self.marks is None:
            self.marks = WriterMarks.from_record(self.row.record)
        return self.marks

    def rename(self, name: str) -> None:
        """The segment is now called ``name`` (a committed rename)."""
        self.row = dataclasses.replace(self.row, name=name)

    def set_chunks(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.chunk_starts = [c.start_offset for c in chunks]

    def put_chunk(self, chunk: Chunk) -> None:
        """Install a new or grown chunk record (the last one) in the cached list."""
        assert self.chunks is not None
        if self.chunks and self.chunk_starts[-1] == chunk.start_offset:
            self.chunks = [*self.chunks[:-1], chunk]
        else:
            self.chunks = [*self.chunks, chunk]
            self.chunk_starts = [*self.chunk_starts, chunk.start_offset]

    def replace_chunk(self, chunk: Chunk) -> None:
        """Install a new version of an existing chunk record (same start offset)."""
        assert self.chunks is not None
        index = self.chunk_index_at(chunk.start_offset)
        if index < 0 or self.chunk_starts[index] != chunk.start_offset:
            raise KeyError(f"no chunk starts at {chunk.start_offset}")
        self.chunks = [*self.chunks[:index], chunk, *self.chunks[index + 1 :]]

    def chunk_at(self, start: int) -> Chunk | None:
        """The chunk record starting at ``start`` (None if there is none)."""
        index = self.chunk_index_at(start)
        if self.chunks is None or index < 0 or self.chunk_starts[index] != start:
            return None
        return self.chunks[index]

    def chunk_index_at(self, offset: int) -> int:
        """Index of the chunk holding ``offset`` (binary search over start offsets)."""
        return bisect.bisect_right(self.chunk_starts, offset) - 1

    def notify_grew(self) -> None:
        if self.grew_event.statistics().tasks_waiting:
            event, self.grew_event = self.grew_event, trio.Event()
            event.set()

    def notify_flushed(self) -> None:
        event, self.flushed_event = self.flushed_event, trio.Event()
        event.set()
