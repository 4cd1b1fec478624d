"""concat: append sealed segments to a target, metadata only, in one transaction, with
an optional deduplicating writer mark (Pravega's segment attributes).

Steps: validate everything; flush the sources and then the target (appends to the
target wait from then on, so its tail is empty); take the namespace lock and every
segment's metadata lock in segment-id order; re-check under the locks; commit one
metadata transaction that moves the sources' chunk records (re-addressed) to the target
and removes the sources; install the result in memory.

Invariants:
- No byte is copied: chunk objects stay where they are, only their records move.
- If one source is bad, none moves; a replayed commit (``writer_seq`` not above the
  target's mark for ``writer``) raises ``AlreadyCommittedError`` and changes nothing.
- Appends to the target that arrive during the concat land after the sources' bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import trio

from tierfs.contracts.errors import (
    AlreadyCommittedError,
    ConcurrentModificationError,
    InvalidArgumentError,
    OffloadRunningError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.engine.clock import now_ns
from tierfs.engine.locks import holding
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.offload.offloader import Offloader
from tierfs.store.listing import segment_info

MAX_WRITER_MARKS = 1024  # per segment; the oldest writer's mark is dropped beyond this

ChunkMoves = dict[tuple[int, int], tuple[int, int]]


def with_writer_mark(record: SegmentMeta, writer: str, writer_seq: int) -> SegmentMeta:
    """``record`` with ``writer_seq`` as ``writer``'s last committed transaction, most
    recent last."""
    marks = dict(zip(record.txn_writer_ids, record.txn_writer_seqs, strict=True))
    marks.pop(writer, None)
    marks[writer] = writer_seq
    kept = list(marks.items())[-MAX_WRITER_MARKS:]
    return dataclasses.replace(
        record,
        txn_writer_ids=tuple(name for name, _ in kept),
        txn_writer_seqs=tuple(seq for _, seq in kept),
    )


def check_writer_seq(dst: SegmentState, writer: str, writer_seq: int | None) -> None:
    if writer and writer_seq is not None:
        marks = dict(zip(dst.record.txn_writer_ids, dst.record.txn_writer_seqs, strict=True))
        if writer in marks and writer_seq <= marks[writer]:
            raise AlreadyCommittedError(dst.name, writer, writer_seq, marks[writer])


class Concatenator:
    def __init__(
        self,
        table: SegmentTable,
        catalogue: ChunkCatalogue,
        offloader: Offloader,
        flush: Callable[[SegmentState], Awaitable[None]],
        notify_growth: Callable[[SegmentState], None],
        names_changed: Callable[..., None],
    ) -> None:
        self._table = table
        self._catalogue = catalogue
        self._offloader = offloader
        self._flush = flush  # journal sync + tier-2 flush of one segment
        self._notify_growth = notify_growth
        self._names_changed = names_changed  # the sources' names are gone

    async def concat(
        self, target: str, sources: str | list[str], *, writer: str = "", writer_seq: int | None = None
    ) -> SegmentInfo:
        source_names = [sources] if isinstance(sources, str) else list(sources)
        if not source_names:
            raise InvalidArgumentError("concat needs at least one source")
        if writer_seq is not None and (not writer or writer_seq < 0):
            raise InvalidArgumentError("writer_seq needs a writer id and must be >= 0")
        if writer and writer_seq is None:
            raise InvalidArgumentError("a writer id needs a writer_seq")
        table = self._table
        dst = table.segment(target)
        srcs = [table.segment(name) for name in source_names]
        if len({id(seg) for seg in [dst, *srcs]}) != len(srcs) + 1:
            raise InvalidArgumentError(f"cannot concat {dst.name!r} onto itself or name a source twice")
        if dst.sealed:
            raise SegmentSealedError(dst.name)
        # checked again under the locks, where it counts; early too, so a replayed
        # commit flushes nothing
        check_writer_seq(dst, writer, writer_seq)
        for src in srcs:
            if not src.sealed:
                raise InvalidArgumentError(f"concat source {src.name!r} must be sealed first")
            if src.start_offset:
                raise InvalidArgumentError(
                    f"concat source {src.name!r} lost its head to retention; it cannot be concatenated"
                )
            if self._offloader.is_running(src):
                raise OffloadRunningError(src.name)
        if dst.merge_done is not None:
            raise ConcurrentModificationError(f"a concat into {dst.name!r} is running; retry")
        for src in srcs:
            await self._flush(src)
        dst.merge_done = trio.Event()
        try:
            await self._flush(dst)  # appends wait from now on: this empties its tail
            metas = [seg.meta_lock for seg in sorted([dst, *srcs], key=lambda seg: seg.segment_id)]
            async with holding([table.lock, *metas]):
                moves = await self._commit(dst, srcs, writer, writer_seq)
        finally:
            done, dst.merge_done = dst.merge_done, None
            done.set()
        self._offloader.chunks_moved(moves)
        for src in srcs:
            src.notify_grew()
            src.notify_flushed()
        dst.notify_grew()
        self._notify_growth(dst)
        self._names_changed(*(src.name for src in srcs))
        return segment_info(dst)

    async def _commit(
        self, dst: SegmentState, srcs: list[SegmentState], writer: str, writer_seq: int | None
    ) -> ChunkMoves:
        """The concat's one transaction; the caller holds the namespace lock and every
        segment's ``meta_lock``. Returns the moved chunks' old -> new addresses."""
        for seg in [dst, *srcs]:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
        for src in srcs:
            if not src.sealed or src.flushed_length != src.appended_length:
                raise ConcurrentModificationError(f"{src.name!r} changed during the concat")
        if dst.sealed or dst.appended_length != dst.flushed_length:
            raise ConcurrentModificationError(f"{dst.name!r} changed during the concat")
        check_writer_seq(dst, writer, writer_seq)
        catalogue = self._catalogue
        await catalogue.chunks_of(dst)
        base = dst.flushed_length
        moved: list[Chunk] = []
        moves: ChunkMoves = {}
        for src in srcs:
            for chunk in await catalogue.chunks_of(src):
                copy = dataclasses.replace(
                    chunk, segment_id=dst.segment_id, start_offset=base + chunk.start_offset
                )
                moved.append(copy)
                moves[(src.segment_id, chunk.start_offset)] = (dst.segment_id, copy.start_offset)
            base += src.flushed_length
        record = dataclasses.replace(
            dst.record,
            flushed_length=base,
            chunk_count=dst.record.chunk_count + len(moved),
            modified_ns=(stamp := now_ns()),
            changed_ns=stamp,
            mtime_set_length=0,
        )
        if writer and writer_seq is not None:
            record = with_writer_mark(record, writer, writer_seq)
        metadata = catalogue.metadata
        revision = await catalogue.call(metadata.concat, dst.row, record, [s.row for s in srcs], moved)
        catalogue.install(dst, revision, record)
        assert dst.chunks is not None
        dst.set_chunks([*dst.chunks, *moved])
        dst.appended_length = dst.durable_length = base
        for src in srcs:
            self._table.remove(src)
        return moves
