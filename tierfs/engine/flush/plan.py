"""One segment's next flush, planned: which durable bytes go where in tier-2, and the
records that commit them.

The storage writer flushes a segment one piece at a time (``flush.storage_writer``), and many
small segments in one batch (``flush.batch``); both plan each piece here:

- the range: from the segment's flushed length, at most ``max_flush_bytes`` of
  **durable** bytes (never bytes a crash could take back), ending where the chunk ends;
- the object: the segment's last chunk, grown in place, when the backend can append,
  the chunk was created by this epoch, has an object of its own (not a pack), has no
  offload attempt, ends exactly at the flushed length and has room below
  ``max_chunk_bytes``; otherwise a new chunk ``s<id>/e<epoch>-c<seq>`` from the
  record's ``next_chunk_seq`` (which a batch may put into a pack instead: ``pack_into``);
- a ``tier2`` segment's piece ends where an append ends, and an append that does not
  fit the last chunk's room starts a new chunk, so the loss of the host never leaves an
  append cut (unless it alone exceeds a flush or a chunk).

Invariants:
- Planning reads only the segment's in-memory state; it changes nothing.
- The chunk record describes exactly the bytes written (``BlockCrcs`` extended with
  them), and the segment record moves ``flushed_length`` (and, for a new chunk,
  ``next_chunk_seq`` and ``chunk_count``) in the same commit.
- mtime moves with the append that holds the last flushed byte, never with the flush.
- The record keeps the writer marks of the appends it commits (``segments.writer_marks``).
"""

from __future__ import annotations

import dataclasses

from tierfs.blocks.checksums import BlockCrcs
from tierfs.contracts.config import StoreConfig
from tierfs.engine.clock import now_ns
from tierfs.engine.object_keys import chunk_name, is_pack_name
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.engine.segments.state import SegmentState


@dataclasses.dataclass(eq=False)
class FlushPiece:
    """Segment bytes ``[start, end)`` written at ``chunk_offset`` of chunk ``name``."""

    seg: SegmentState
    start: int
    end: int
    name: str
    chunk_offset: int  # where the bytes go in the chunk (the grown chunk's length, or 0)
    last: Chunk | None  # the segment's last chunk when planned
    new_seq: int | None  # the new chunk's sequence number; None when growing ``last``
    crcs: BlockCrcs
    data: bytes = b""
    object_offset: int = 0  # where the chunk starts in its object (a pack)

    @property
    def grows(self) -> bool:
        return self.new_seq is None

    def pack_into(self, pack: str, object_offset: int) -> None:
        """Write this new chunk at ``object_offset`` of the pack object ``pack`` instead
        of an object of its own (its sequence number is consumed all the same)."""
        assert not self.grows
        self.name = pack
        self.object_offset = object_offset

    def take(self, data: bytes) -> None:
        """The piece's bytes (read from the tail): checksummed for the chunk record."""
        self.data = data
        self.crcs.extend(data)

    def chunk(self, epoch: int) -> Chunk:
        """The chunk record once the bytes are written."""
        last = self.last
        return Chunk(
            name=self.name,
            segment_id=self.seg.segment_id,
            start_offset=self.start - self.chunk_offset,
            length=self.crcs.length,
            crc32c=self.crcs.whole,
            block_crc32c=tuple(self.crcs.blocks),
            epoch=epoch,
            created_ns=last.created_ns if self.grows and last is not None else now_ns(),
            location="",
            object_offset=self.object_offset,
        )

    def record(self) -> SegmentMeta:
        """The segment record once the piece is committed (one new value: a batch makes
        one per segment it flushes)."""
        record = self.seg.record
        modified_ns, changed_ns = flushed_times(self.seg, self.end)
        marks = self.seg.marks  # None: no identified append since the record was loaded
        if marks is not None:
            record = marks.persisted(record, self.end)
        if self.new_seq is None:
            return dataclasses.replace(
                record, flushed_length=self.end, modified_ns=modified_ns, changed_ns=changed_ns
            )
        return dataclasses.replace(
            record, flushed_length=self.end, modified_ns=modified_ns, changed_ns=changed_ns,
            next_chunk_seq=self.new_seq + 1, chunk_count=record.chunk_count + 1,
        )

    def overtaken(self) -> bool:
        """An offload attempt replaced the grown chunk's record while the bytes were
        written: its record wins (the bytes past its length are never read) and the
        next flush starts a new chunk."""
        chunks = self.seg.chunks
        return self.grows and bool(chunks) and chunks is not None and chunks[-1] is not self.last


def plan_flush(
    seg: SegmentState, chunks: list[Chunk], config: StoreConfig, epoch: int, supports_append: bool
) -> FlushPiece:
    """The next piece of ``seg`` to flush (``chunks``: its chunk records, loaded)."""
    start = seg.flushed_length
    end = min(seg.durable_length, start + config.max_flush_bytes)
    last = chunks[-1] if chunks else None
    grow = (
        supports_append
        and last is not None
        and last.epoch == epoch
        and not last.object_offset
        and not is_pack_name(last.name)  # other segments' chunks follow it in the pack
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
        end = min(end, last.start_offset + config.max_chunk_bytes)
        piece = FlushPiece(seg, start, end, last.name, last.length, last, None,
                           BlockCrcs(last.length, last.crc32c, list(last.block_crc32c)))
    else:
        new_seq = seg.record.next_chunk_seq
        end = min(end, start + config.max_chunk_bytes)
        piece = FlushPiece(seg, start, end, chunk_name(seg.segment_id, epoch, new_seq), 0, last, new_seq,
                           BlockCrcs())
    if whole:  # cut only an append larger than max_flush_bytes or a chunk
        piece.end = seg.tail.whole_appends_end(start, piece.end) or piece.end
    return piece


def flushed_times(seg: SegmentState, end: int) -> tuple[int, int]:
    """The record's (mtime, ctime) as they are once bytes up to ``end`` are flushed:
    they move to the time of the append holding byte ``end - 1``, unless an explicit
    set covers it (``mtime_set_length``); the flush itself never moves them."""
    record = seg.record
    if end <= record.mtime_set_length:
        return record.modified_ns, record.changed_ns
    append_ns = seg.tail.wall_ns_at(end) or now_ns()  # 0: replayed from an old journal
    return append_ns, max(record.changed_ns, append_ns)
