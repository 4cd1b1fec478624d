"""Namespace operations: create, mkdir, rmdir, delete, rename.

Invariants:
- Serialized by the table's namespace lock and committed to metadata before the
  in-memory table changes; a failed commit leaves memory unchanged.
- Every argument is validated (names made canonical) before any change.
- Rename moves names only: no byte of any segment is copied, and chunk object names
  never derive from segment names.
- A deleted segment's unflushed bytes leave the backlog and its tail's memory at once;
  its objects are garbage-collected in the background.
"""

from __future__ import annotations

from tierfs.contracts import names
from tierfs.contracts.config import DURABILITY_LEVELS, StoreConfig
from tierfs.contracts.errors import (
    InvalidArgumentError,
    NotADirectoryError_,
    SegmentExistsError,
    SegmentNotFoundError,
)
from tierfs.contracts.info import SegmentInfo
from tierfs.engine.catalogue import ChunkCatalogue
from tierfs.engine.garbage import GarbageCollector
from tierfs.engine.metadata import now_ns
from tierfs.engine.record_types import SegmentMeta
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.segment_table import SegmentTable
from tierfs.engine.storage_writer import StorageWriter
from tierfs.engine.tail import TailBudget
from tierfs.store.listing import segment_info


class Namespace:
    def __init__(
        self,
        config: StoreConfig,
        table: SegmentTable,
        catalogue: ChunkCatalogue,
        writer: StorageWriter,
        tail_budget: TailBudget,
        garbage: GarbageCollector,
    ) -> None:
        self._config = config
        self._table = table
        self._catalogue = catalogue
        self._writer = writer
        self._tail_budget = tail_budget
        self._garbage = garbage

    async def create(
        self, name: str, *, durability: str | None = None, make_parents: bool = False
    ) -> SegmentInfo:
        """Create an empty segment. Its parent directory must exist unless
        ``make_parents``; ``durability`` is 'pd', 'vd' or 'tier2' (default: the store's)."""
        table = self._table
        table.check_open()
        canonical = names.canonical(name)
        level = durability or self._config.durability
        if level not in DURABILITY_LEVELS:
            raise InvalidArgumentError(f"durability must be one of {DURABILITY_LEVELS}")
        if make_parents:
            parent = names.parent_of(canonical)
            if parent:
                await self.mkdir(parent, parents=True, exist_ok=True)
        async with table.lock:
            if table.taken(canonical):
                raise SegmentExistsError(canonical)
            parent = table.check_parent(canonical)
            stamp = now_ns()
            record = SegmentMeta(
                durability=level, created_ns=stamp, modified_ns=stamp, next_chunk_seq=1
            )
            metadata = self._catalogue.metadata
            row = await self._catalogue.call(metadata.create_segment, canonical, parent, record)
            seg = SegmentState(row, appended_length=0, durable_length=0)
            seg.set_chunks([])
            table.add(seg)
        return segment_info(seg)

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        table = self._table
        table.check_open()
        canonical = names.canonical(name)
        if parents:
            parts = canonical.split("/")
            for depth in range(1, len(parts)):
                await self.mkdir("/".join(parts[:depth]), exist_ok=True)
        async with table.lock:
            if canonical in table.directories:
                if exist_ok:
                    return
                raise SegmentExistsError(canonical)
            if canonical in table.by_name:
                raise SegmentExistsError(canonical)
            parent = table.check_parent(canonical)
            metadata = self._catalogue.metadata
            table.add_directory(canonical, await self._catalogue.call(metadata.mkdir, canonical, parent))

    async def rmdir(self, name: str) -> None:
        table = self._table
        table.check_open()
        canonical = names.canonical(name)
        async with table.lock:
            if canonical not in table.directories:
                if canonical in table.by_name:
                    raise NotADirectoryError_(canonical)
                raise SegmentNotFoundError(canonical)
            await self._catalogue.call(self._catalogue.metadata.rmdir, canonical)
            table.remove_directory(canonical)

    async def delete(self, name: str) -> None:
        """Delete a segment; its chunks are garbage-collected in the background."""
        table = self._table
        seg = table.segment(name)
        async with table.lock, seg.meta_lock:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            chunk_names = await self._catalogue.call(self._catalogue.metadata.delete_segment, seg.row)
            table.remove(seg)
            self._writer.forget(seg)
            seg.tail.clear(self._tail_budget)
            seg.notify_grew()
            seg.notify_flushed()
        if chunk_names:
            self._garbage.collect_soon()

    async def rename(self, old: str, new: str) -> None:
        """Rename a segment or a directory (with everything below it); metadata only."""
        table = self._table
        table.check_open()
        source = names.canonical(old)
        target = names.canonical(new)
        if source == target:
            raise InvalidArgumentError(f"cannot rename {source!r} onto itself")
        if names.is_within(target, source):
            raise InvalidArgumentError(f"cannot move {source!r} inside itself")
        async with table.lock:
            is_directory = source in table.directories
            if not is_directory and source not in table.by_name:
                raise SegmentNotFoundError(source)
            if table.taken(target):
                raise SegmentExistsError(target)
            parent = table.check_parent(target)
            metadata = self._catalogue.metadata
            await self._catalogue.call(metadata.rename, source, target, parent, is_directory)
            table.move(source, target)
