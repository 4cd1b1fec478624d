"""The chunk catalogue: the engine's one way into the metadata store from the event loop.

Every metadata call runs in a worker thread under a limiter of one (SQLite has one
writer), except an unsynced SQLite commit, which never waits for the disk and runs on
the event loop under the same limiter (``call_on_loop``: a create, whose journal frame
keeps it until the metadata syncs). Every commit that changes a segment's row or chunks
is installed into the segment's in-memory state right after it succeeds
(write-through), so readers of the state always see what the metadata holds.

Invariants:
- Reads ask only for the records they cover (``chunks_covering``); a segment's whole
  chunk list is loaded once by the parts that need it (flush, defrag, offload,
  layout, fsck), then kept write-through; records are frozen
  values (``record_types``), replaced (``dataclasses.replace``), never mutated.
- Commits are conditional on the row's revision (``MetadataStore``); on failure the
  in-memory state is unchanged.
- Callers of ``update_record``/``commit_chunk`` hold the segment's ``meta_lock``.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import trio

from tierfs.engine.clock import now_ns
from tierfs.engine.metadata.database import SQLITE
from tierfs.engine.metadata.scans import hot_copies_pending, object_references
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.object_keys import ObjectReferences
from tierfs.engine.record_types import Chunk, SegmentMeta, SegmentRow
from tierfs.engine.segments.state import SegmentState

T = TypeVar("T")


class ChunkRows(Protocol):
    """Chunk records read on demand (``engine.segment_rows``, its own read connection)."""

    def chunks_covering(self, segment_id: int, start: int, end: int) -> list[Chunk]: ...


class ChunkCatalogue:
    def __init__(self, metadata: MetadataStore, rows: ChunkRows) -> None:
        self.metadata = metadata
        self._rows = rows
        self._limiter = trio.CapacityLimiter(1)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one ``MetadataStore`` method off the event loop."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    @property
    def commits_on_loop(self) -> bool:
        """Whether the next commit may be an unsynced one on the event loop
        (``call_on_loop``): on SQLite, which only writes its WAL into the page cache,
        unless the WAL is due a checkpoint (a synced commit in the worker thread runs
        it); a PostgreSQL commit is a network round trip and always durable."""
        database = self.metadata.database
        return database.dialect == SQLITE and not database.checkpoint_due

    async def call_on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a ``MetadataStore`` call that never waits for the disk (an unsynced
        SQLite commit: no fsync, and checkpoints only ever run in ``call``) on the event
        loop, under the same limiter as ``call``: a thread hop costs more than it."""
        async with self._limiter:
            return fn(*args)

    async def chunks_of(self, seg: SegmentState) -> list[Chunk]:
        """The segment's chunk records (loaded once, then kept write-through)."""
        if seg.chunks is None:
            chunks = await self.call(self.metadata.load_chunks, seg.segment_id)
            if seg.chunks is None:
                seg.set_chunks(chunks)
        assert seg.chunks is not None
        return seg.chunks

    def chunks_covering(self, seg: SegmentState, start: int, end: int) -> list[Chunk]:
        """The records overlapping ``[start, end)``: a slice of the loaded list, or an
        index range of the metadata for a segment whose list nobody loaded (a read
        costs what it reads, not what the segment holds). The metadata has every commit
        before its install here, so either answer is a committed state."""
        chunks = seg.chunks
        if chunks is None:
            return self._rows.chunks_covering(seg.segment_id, start, end)
        first = max(seg.chunk_index_at(start), 0)
        last = bisect.bisect_left(seg.chunk_starts, end, lo=first)
        return chunks[first:last]

    def install(self, seg: SegmentState, revision: int, record: SegmentMeta) -> None:
        seg.row = SegmentRow(seg.segment_id, seg.name, revision, record)

    async def update_record(self, seg: SegmentState, **fields: Any) -> None:
        """Commit a new segment record with ``fields`` changed and a new ctime (a
        metadata change: mtime moves only with appends or an explicit set)."""
        record = dataclasses.replace(seg.record, **{"changed_ns": now_ns(), **fields})
        self.install(seg, await self.call(self.metadata.update_segment, seg.row, record), record)

    async def commit_flush(self, seg: SegmentState, record: SegmentMeta, chunk: Chunk) -> None:
        """A flush: the new or grown chunk record and the segment record, together."""
        self.install(seg, await self.call(self.metadata.commit_flush, seg.row, record, chunk), record)
        seg.put_chunk(chunk)

    async def commit_flushes(self, flushes: list[tuple[SegmentState, SegmentMeta, Chunk]]) -> None:
        """Many segments' flushes in one transaction, all or nothing (the storage
        writer's batches); installed into each segment once it committed."""
        revisions = await self.call(
            self.metadata.commit_flushes, [(seg.row, record, chunk) for seg, record, chunk in flushes]
        )
        for (seg, record, chunk), revision in zip(flushes, revisions, strict=True):
            self.install(seg, revision, record)
            seg.put_chunk(chunk)

    async def commit_chunk(self, seg: SegmentState, chunk: Chunk) -> None:
        """A new version of an existing chunk record (same start offset)."""
        revision = await self.call(self.metadata.commit_chunk_update, seg.row, chunk)
        self.install(seg, revision, seg.record)
        seg.replace_chunk(chunk)

    async def truncate_head(self, seg: SegmentState, record: SegmentMeta, chunks: list[Chunk]) -> None:
        """Retention: drop the first ``len(chunks)`` chunk records with the new record."""
        current = await self.chunks_of(seg)
        self.install(seg, await self.call(self.metadata.truncate_head, seg.row, record, chunks), record)
        seg.set_chunks(current[len(chunks):])

    async def replace_chunks(
        self, seg: SegmentState, record: SegmentMeta, old: list[Chunk], merged: Chunk, collect_after_ns: int
    ) -> None:
        """Defrag: the adjacent records ``old`` (as the cached list holds them) become
        ``merged``; the cached list is replaced by a new list in one step, so a reader
        sees either the old chunks or the merged one, never a gap."""
        revision = await self.call(
            self.metadata.replace_chunks, seg.row, record, old, merged, collect_after_ns
        )
        self.install(seg, revision, record)
        current = await self.chunks_of(seg)
        first = current.index(old[0])
        seg.set_chunks([*current[:first], merged, *current[first + len(old):]])

    async def queue_garbage(self, names: list[str]) -> None:
        if names:
            await self.call(self.metadata.queue_garbage, names)

    async def object_references(self) -> ObjectReferences:
        """Every object name the metadata references or queues, at one instant."""
        return await self.call(object_references, self.metadata.database)

    async def prune_change_log(self, up_to_seq: int) -> None:
        """The changes up to ``up_to_seq`` are on tier-2 (``metadata.change_log``)."""
        await self.call(self.metadata.prune_change_log, up_to_seq)

    async def set_checkpoint(self, lsn: int) -> None:
        """Journal files wholly below ``lsn`` may be deleted (recovery starts there)."""
        await self.call(self.metadata.set_checkpoint, lsn)

    async def hot_copies_pending(self) -> dict[tuple[int, int], float]:
        """(segment id, chunk start) -> completion time (s) of every offloaded chunk whose
        chunk-store copy still exists (read once at start-up)."""

        pending = await self.call(hot_copies_pending, self.metadata.database)
        return {key: completed_ns / 1e9 for key, completed_ns in pending.items()}
