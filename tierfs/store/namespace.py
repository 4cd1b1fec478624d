"""Namespace operations: create, mkdir, rmdir, delete, rename.

Invariants:
- Serialized by the table's namespace lock and committed to metadata before the
  in-memory table changes; a failed commit leaves memory unchanged.
- Every argument is validated (names made canonical) before any change.
- Rename moves names only: no byte of any segment is copied, and chunk object names
  never derive from segment names. Renaming onto an existing name replaces it in the
  same transaction (POSIX rename): an unsealed segment by a segment, an empty
  directory by a directory; a sealed segment only where its directory's policy has
  ``rewrite_replaces=1`` (git renames read-only packs over read-only packs; the sealed
  segment itself never changes), else ``sealed``; a directory never by a segment or
  the reverse.
- Every change moves the mtime/ctime of the directories whose entries it changes, in
  the same transaction (``attributes.touched``).
- A deleted segment's unflushed bytes leave the backlog and its tail's memory at once;
  its objects are garbage-collected in the background.
- A segment deleted or replaced (by rename or by a rewrite) while a descriptor holds it
  (``SegmentState.holds``) is detached in the same transaction instead: its row moves
  to ``names.detached_name``, in no directory, and it keeps its state, backlog and
  bytes until its last hold goes (``delete_detached``). So a name is replaced
  atomically for everyone, and an open descriptor keeps the file it opened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tierfs.contracts import names
from tierfs.contracts.config import DURABILITY_LEVELS, StoreConfig
from tierfs.contracts.errors import (
    DirectoryNotEmptyError,
    InvalidArgumentError,
    IsADirectoryError_,
    NotADirectoryError_,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.engine import records
from tierfs.engine.clock import now_ns
from tierfs.engine.flush.storage_writer import StorageWriter
from tierfs.engine.locks import holding
from tierfs.engine.ports import CreationLog
from tierfs.engine.record_types import DirectoryMeta, SegmentMeta, SegmentRow
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail import TailBudget
from tierfs.engine.upkeep.garbage import GarbageCollector
from tierfs.store.attributes import segment_info, touched

# Room a create frame takes besides its name: the frame's headers and a segment record
# (a few dozen bytes), with plenty to spare; reserved in the journal before the commit.
CREATE_FRAME_MAX_BYTES = 4096


class Namespace:
    def __init__(
        self,
        config: StoreConfig,
        table: SegmentTable,
        catalogue: ChunkCatalogue,
        writer: StorageWriter,
        tail_budget: TailBudget,
        garbage: GarbageCollector,
        names_changed: Callable[..., None],
        creations: CreationLog,
        rewrites_allowed: Callable[[str], bool] = lambda directory: False,
    ) -> None:
        self._config = config
        self._table = table
        self._catalogue = catalogue
        self._writer = writer
        self._tail_budget = tail_budget
        self._garbage = garbage
        self._names_changed = names_changed  # names created, removed or moved, after commit
        self._creations = creations  # the journal: creation frames
        # directory -> whether its policy has rewrite_replaces=1: there a rename may
        # replace a sealed segment's name (git's read-only packs), the segment unchanged
        self._rewrites_allowed = rewrites_allowed

    async def create(
        self, name: str, *, durability: str | None = None, make_parents: bool = False, synced: bool = True
    ) -> SegmentInfo:
        """Create an empty segment. Its parent directory must exist unless
        ``make_parents``; ``durability`` is 'pd', 'vd' or 'tier2' (default: the store's).

        On SQLite the creation commits without an fsync, on the event loop, and its
        journal frame (written at once) makes it durable with the journal's next sync:
        ``synced`` waits for that sync (a round of its own if nothing else asks); without
        it the creation is durable like a VD append, within ``vd_sync_interval_s`` and
        before any PD append to the segment is acknowledged (a file system's create:
        the mount). PostgreSQL commits are durable when they return."""
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
            if table.taken_in_memory(canonical):
                raise SegmentExistsError(canonical)
            parent = table.check_parent(canonical)
            stamp = now_ns()
            record = SegmentMeta(
                durability=level, created_ns=stamp, modified_ns=stamp, changed_ns=stamp, next_chunk_seq=1
            )
            parents = self._touched([parent], stamp)
            row, frame_end_lsn = await self._commit_creation(canonical, parent, record, parents)
            seg = SegmentState(row, appended_length=0, durable_length=0)
            seg.set_chunks([])
            seg = table.add(seg)
            self._install(parents)
        self._names_changed(canonical)
        if synced and frame_end_lsn is not None:
            await self._creations.wait_durable(frame_end_lsn)
        elif frame_end_lsn is not None:
            await self._creations.wait_written(frame_end_lsn)  # at once, unless the journal is stalled
        return segment_info(seg)

    async def _commit_creation(
        self, name: str, parent: str, record: SegmentMeta, parents: dict[str, DirectoryMeta]
    ) -> tuple[SegmentRow, int | None]:
        """The creation's row, and the end LSN of its journal frame (None: the commit
        itself was durable). Caller holds the namespace lock."""
        catalogue, metadata = self._catalogue, self._catalogue.metadata
        if not catalogue.commits_on_loop:
            return await catalogue.call(metadata.create_segment, name, parent, record, parents), None
        return await catalogue.call_on_loop(self._commit_and_log, name, parent, record, parents)

    def _commit_and_log(
        self, name: str, parent: str, record: SegmentMeta, parents: dict[str, DirectoryMeta]
    ) -> tuple[SegmentRow, int]:
        """On the event loop, in one step: the journal's room for the frame first (a
        full disk refuses the create before anything changed), the unsynced commit, then
        the frame, queued and written before anything else runs: every later frame (this
        segment's appends first) follows it, so a sync that covers them covers it."""
        creations = self._creations
        creations.make_room(CREATE_FRAME_MAX_BYTES + len(name.encode()))
        row = self._catalogue.metadata.create_segment(name, parent, record, parents, synced=False)
        frame_end_lsn = creations.add_create(row.segment_id, name, records.dump(row.record))
        creations.write_queued()
        return row, frame_end_lsn

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
            if table.get(canonical) is not None:
                raise SegmentExistsError(canonical)
            parent = table.check_parent(canonical)
            metadata = self._catalogue.metadata
            directories = self._touched([parent], now_ns())
            table.add_directory(canonical, await self._catalogue.call(metadata.mkdir, canonical, parent, directories))
            self._install(directories)
        self._names_changed(canonical)

    async def rmdir(self, name: str) -> None:
        table = self._table
        table.check_open()
        canonical = names.canonical(name)
        async with table.lock:
            if canonical not in table.directories:
                if table.get(canonical) is not None:
                    raise NotADirectoryError_(canonical)
                raise SegmentNotFoundError(canonical)
            parents = self._touched([names.parent_of(canonical)], now_ns())
            await self._catalogue.call(self._catalogue.metadata.rmdir, canonical, parents)
            table.remove_directory(canonical)
            self._install(parents)
        self._names_changed(canonical)

    async def delete(self, name: str) -> None:
        """Delete a segment; its chunks are garbage-collected in the background. A held
        segment (``SegmentState.holds``) is detached instead: it leaves the namespace
        now and goes when its last hold does (``delete_detached``)."""
        await self._remove(self._table.segment(name))

    async def delete_detached(self, seg: SegmentState) -> None:
        """Delete a detached segment (its last hold went, or the store just opened)."""
        await self._remove(seg)

    async def _remove(self, seg: SegmentState) -> None:
        table = self._table
        async with table.lock, seg.meta_lock:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            name, metadata = seg.name, self._catalogue.metadata
            detached = names.is_detached(name)
            parents = {} if detached else self._touched([names.parent_of(name)], now_ns())
            chunk_names: list[str] = []
            if seg.holds and not detached:
                table.move(name, await self._catalogue.call(metadata.detach_segment, seg.row, parents))
            else:
                chunk_names = await self._catalogue.call(metadata.delete_segment, seg.row, parents)
                self._forget(seg)
            self._install(parents)
        if not detached:
            self._names_changed(name)
        if chunk_names:
            self._garbage.collect_soon()

    async def replace_with_empty(self, name: str) -> SegmentInfo:
        """A whole-file rewrite: a new empty segment under ``name`` (same durability,
        mode and owner) replaces the segment there in one transaction; the old one is
        deleted, or detached while held. A sealed segment is never replaced."""
        table = self._table
        table.check_open()
        seg = table.segment(name)
        async with table.lock, seg.meta_lock:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            if seg.sealed:
                raise SegmentSealedError(seg.name)
            name, old, stamp = seg.name, seg.record, now_ns()
            record = SegmentMeta(
                durability=old.durability, created_ns=stamp, modified_ns=stamp, changed_ns=stamp,
                next_chunk_seq=1, mode=old.mode, owner_set=old.owner_set, uid=old.uid, gid=old.gid,
            )
            parents = self._touched([names.parent_of(name)], stamp)
            detach = seg.holds > 0
            row, garbage = await self._catalogue.call(
                self._catalogue.metadata.replace_segment, seg.row, detach, record, parents
            )
            if detach:
                table.move(name, names.detached_name(seg.segment_id))
            else:
                self._forget(seg)
            new = SegmentState(row, appended_length=0, durable_length=0)
            new.set_chunks([])
            new = table.add(new)
            self._install(parents)
        self._names_changed(name)
        if garbage:
            self._garbage.collect_soon()
        return segment_info(new)

    def _forget(self, seg: SegmentState) -> None:
        """A deleted (or replaced) segment leaves memory, the backlog and its readers."""
        self._table.remove(seg)
        self._writer.forget(seg)
        seg.tail.clear(self._tail_budget)
        seg.notify_grew()
        seg.notify_flushed()

    def _touched(self, directories: list[str], stamp_ns: int) -> dict[str, DirectoryMeta]:
        """New records of ``directories`` whose entries change at ``stamp_ns``."""
        table = self._table
        return {d: touched(table.directory_record(d), stamp_ns) for d in directories}

    def _install(self, records: dict[str, DirectoryMeta]) -> None:
        for name, record in records.items():
            if self._table.is_directory(name) and (name == "" or name in self._table.directories):
                self._table.set_directory_record(name, record)

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
            moving = None if is_directory else table.get(source)  # held until it is renamed
            if not is_directory and moving is None:
                raise SegmentNotFoundError(source)
            replaced = self._replaced_by_rename(target, is_directory)
            parent = table.check_parent(target)
            stamp = now_ns()
            parents = self._touched(sorted({names.parent_of(source), parent}), stamp)
            if is_directory:  # a rename changes the moved entry's ctime too
                parents[target] = dataclasses.replace(table.directories[source], changed_ns=stamp)
            metadata = self._catalogue.metadata
            segments = sorted([s for s in (moving, replaced) if s is not None], key=lambda s: s.segment_id)
            async with holding([s.meta_lock for s in segments]):  # in id order, as every taker
                if moving is not None and moving.deleted:
                    raise SegmentNotFoundError(source)
                moved = None if moving is None else dataclasses.replace(moving.record, changed_ns=stamp)
                if replaced is None:
                    _, revision = await self._catalogue.call(
                        metadata.rename, source, target, parent, is_directory, None,
                        target in table.directories, parents, False, None if moving is None else moving.row, moved,
                    )
                    if target in table.directories:
                        table.remove_directory(target)
                    garbage: list[str] = []
                else:
                    if replaced.deleted:
                        raise SegmentNotFoundError(target)
                    if replaced.sealed and not self._rewrites_allowed(parent):  # sealed meanwhile
                        raise SegmentSealedError(target)
                    detach = replaced.holds > 0  # held: it lives on, detached, in this transaction
                    garbage, revision = await self._catalogue.call(
                        metadata.rename, source, target, parent, is_directory, replaced.row, False, parents,
                        detach, None if moving is None else moving.row, moved,
                    )
                    if detach:
                        table.move(target, names.detached_name(replaced.segment_id))
                    else:
                        self._forget(replaced)
                table.move(source, target)
                if moving is not None and moved is not None:
                    moving.row = SegmentRow(moving.segment_id, target, revision, moved)
            self._install(parents)
        self._names_changed(source, target)
        if garbage:
            self._garbage.collect_soon()

    def _replaced_by_rename(self, target: str, is_directory: bool) -> SegmentState | None:
        """What a rename onto ``target`` replaces: None if it is free or an empty
        directory (a directory moving onto it), the segment otherwise; refuses the
        rest before anything changes."""
        table = self._table
        if target in table.directories:
            if not is_directory:
                raise IsADirectoryError_(target)
            if table.has_entries(target):
                raise DirectoryNotEmptyError(target)
            return None
        seg = table.get(target)
        if seg is None:
            return None
        if is_directory:
            raise NotADirectoryError_(target)
        if seg.sealed and not self._rewrites_allowed(names.parent_of(target)):
            raise SegmentSealedError(target)  # a sealed segment's name is replaced only under the policy
        return seg
