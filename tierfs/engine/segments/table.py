"""The namespace in memory: every directory's record, and the segments in use.

A store of a million segments opens without loading them: a segment's state is loaded
from the metadata (``SegmentRows``) the first time it is named, and kept while anything
uses it and among the ``recent_limit`` most recently used. Directories are few next to
segments and are all loaded when the store opens (listings, ``st_nlink`` and policies
read them on every call).

Invariants:
- Keys are canonical names (``names.canonical``): a hit needs no validation.
- One state per segment: while any part holds a segment's ``SegmentState`` (an appender,
  a reader, the storage writer's backlog, a waiter), every lookup by name or id returns
  that same object (weak maps), so no change can land on a copy. A state nobody holds
  and that fell out of the recent set is dropped; it holds nothing the metadata lacks
  (a segment with unflushed bytes is in the storage writer's backlog, which holds it).
- A row loaded from the metadata whose segment is in memory under another name is a
  change in flight (committed, not yet installed): the state in memory wins, so every
  answer matches the order in which changes are installed.
- ``children`` indexes the directories under their parent ('' is the root); a
  directory's segments are listed from the metadata, one index range per listing.
- The table changes only after the metadata commit that made the change succeeded;
  callers hold the namespace lock for every change that spans entries.
- Lookups that miss memory read the metadata synchronously: an index lookup on
  SQLite's own read connection (tens of µs); on PostgreSQL a round trip on the event
  loop, which stays cheaper than a thread hop per stat on the local network.
- Once closed, every lookup raises ``StoreClosedError``.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterator
from typing import Protocol

import trio

from tierfs.contracts import names
from tierfs.contracts.errors import (
    IsADirectoryError_,
    NotADirectoryError_,
    SegmentNotFoundError,
    StoreClosedError,
)
from tierfs.engine.record_types import DirectoryMeta, SegmentRow
from tierfs.engine.segments.state import SegmentState

# Segment states kept after their last use, most recent first: a state costs ~2 KiB, so
# this keeps ~32 MiB for the working set of stats and reads between two lookups of a name.
RECENT_SEGMENTS = 16384


class SegmentRows(Protocol):
    """The metadata's segment rows, read on demand (``engine.segment_rows``)."""

    def by_name(self, name: str) -> SegmentRow | None: ...
    def by_id(self, segment_id: int) -> SegmentRow | None: ...
    def in_directory(self, directory: str) -> list[SegmentRow]: ...
    def any_in_directory(self, directory: str) -> bool: ...
    def walk(self, under: str = "") -> Iterator[list[SegmentRow]]: ...
    def count(self) -> int: ...


def fresh_state(row: SegmentRow) -> SegmentState:
    """The state of a segment with no unflushed bytes (as the metadata holds it)."""
    flushed = row.record.flushed_length
    return SegmentState(row, appended_length=flushed, durable_length=flushed)


class SegmentTable:
    def __init__(self, recent_limit: int = RECENT_SEGMENTS) -> None:
        self._by_name: weakref.WeakValueDictionary[str, SegmentState] = weakref.WeakValueDictionary()
        self._by_id: weakref.WeakValueDictionary[int, SegmentState] = weakref.WeakValueDictionary()
        self._recent: collections.OrderedDict[int, SegmentState] = collections.OrderedDict()
        self._recent_limit: int | None = recent_limit
        self._rows: SegmentRows | None = None  # None until the store opens: nothing to load
        self.segment_count = 0
        self.directories: dict[str, DirectoryMeta] = {}  # by name ('' not included)
        self.children: dict[str, set[str]] = {}  # directory ('' root) -> directories in it
        self.root_directory = DirectoryMeta()  # loaded when the store opens
        # serializes namespace changes (create, mkdir, rmdir, rename, delete, concat)
        self.lock = trio.Lock()
        self.closed = False

    def attach(self, rows: SegmentRows) -> None:
        """Where segments not in memory are looked up (when the store opens)."""
        self._rows = rows
        self.segment_count = rows.count()

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError("the store is closed")

    # ------------------------------------------------------------------ lookups
    def segment(self, name: str) -> SegmentState:
        """The live segment called ``name``; ``SegmentNotFoundError`` or
        ``IsADirectoryError_`` otherwise."""
        self.check_open()
        seg = self._by_name.get(name)
        if seg is None:
            canonical = names.canonical(name)
            seg = self._by_name.get(canonical)
            if seg is None:
                seg = self._load(canonical)
            if seg is None:
                if canonical in self.directories:
                    raise IsADirectoryError_(canonical)
                raise SegmentNotFoundError(canonical)
        self._use(seg)
        return seg

    def get(self, name: str) -> SegmentState | None:
        """The segment called ``name`` (canonical), or None."""
        seg = self._by_name.get(name)
        if seg is None:
            seg = self._load(name)
        if seg is not None:
            self._use(seg)
        return seg

    def row_or_state(self, name: str) -> SegmentState | SegmentRow | None:
        """What ``stat`` needs, without keeping a state for a segment nobody uses: its
        state if in memory, else its row (it then has no unflushed bytes)."""
        seg = self._by_name.get(name)
        if seg is not None or self._rows is None:
            return seg
        return self._current(self._rows.by_name(name), name)

    def _current(self, row: SegmentRow | None, name: str) -> SegmentState | SegmentRow | None:
        """``row`` (read by ``name``) as things stand: the state in memory if its
        segment is held (None if held under another name: a change in flight)."""
        if row is None:
            return None
        held = self._by_id.get(row.segment_id)
        if held is not None:
            return held if held.name == name else None
        return row

    def segment_by_id(self, segment_id: int) -> SegmentState | None:
        seg = self._by_id.get(segment_id)
        if seg is None and self._rows is not None:
            row = self._rows.by_id(segment_id)
            if row is not None:
                seg = self._register(fresh_state(row))
        if seg is not None:
            self._use(seg)
        return seg

    def _load(self, name: str) -> SegmentState | None:
        found = self._current(self._rows.by_name(name), name) if self._rows is not None else None
        if isinstance(found, SegmentRow):
            return self._register(fresh_state(found))
        return found

    def _register(self, seg: SegmentState) -> SegmentState:
        self._by_name[seg.name] = seg
        self._by_id[seg.segment_id] = seg
        return seg

    def _use(self, seg: SegmentState) -> None:
        recent = self._recent
        if recent.get(seg.segment_id) is seg:
            recent.move_to_end(seg.segment_id)
            return
        recent[seg.segment_id] = seg
        if self._recent_limit is not None and len(recent) > self._recent_limit:
            recent.popitem(last=False)

    def in_memory(self) -> list[SegmentState]:
        """Every segment state in memory: all that have unflushed bytes among them."""
        return [seg for seg in self._by_id.values() if not seg.deleted]

    def walk(self, under: str = "") -> Iterator[SegmentState | SegmentRow]:
        """Every segment (below ``under``), in name order: its state if in memory, else
        its row. The caller must not keep rows across awaits as if they were current."""
        if self._rows is None:
            return
        for batch in self._rows.walk(under):
            for row in batch:
                seg = self._by_id.get(row.segment_id)
                if seg is None:
                    yield row
                elif seg.name == row.name and not seg.deleted:
                    yield seg

    def segments_in(self, directory: str) -> list[SegmentState | SegmentRow]:
        """The segments directly in ``directory``, by name (states where in memory)."""
        result: list[SegmentState | SegmentRow] = []
        if self._rows is None:
            return result
        for row in self._rows.in_directory(directory):
            seg = self._by_id.get(row.segment_id)
            if seg is None:
                result.append(row)
            elif seg.name == row.name and not seg.deleted:
                result.append(seg)
        return result

    def has_entries(self, directory: str) -> bool:
        """Whether anything is in ``directory`` (the metadata checks again at commit)."""
        if self.children.get(directory):
            return True
        return self._rows is not None and self._rows.any_in_directory(directory)

    def taken_in_memory(self, name: str) -> bool:
        """Whether ``name`` is a directory or a segment held in memory. A segment known
        only to the metadata is not looked up here: the metadata's own check at commit
        refuses it, so a create costs no read of the metadata first."""
        return name in self.directories or name in self._by_name

    def is_directory(self, name: str) -> bool:
        return name == "" or name in self.directories

    def require_directory(self, name: str) -> None:
        """``name`` ('' is the root) is a directory, else the error a user expects."""
        if name and name not in self.directories:
            if self.get(name) is not None:
                raise NotADirectoryError_(name)
            raise SegmentNotFoundError(name)

    def check_parent(self, name: str) -> str:
        """The parent directory of ``name``, which must exist."""
        parent = names.parent_of(name)
        self.require_directory(parent)
        return parent

    def directory_record(self, name: str) -> DirectoryMeta:
        return self.root_directory if name == "" else self.directories[name]

    def set_directory_record(self, name: str, record: DirectoryMeta) -> None:
        if name == "":
            self.root_directory = record
        else:
            self.directories[name] = record

    def subdirectories_of(self, directory: str) -> int:
        """How many directories are directly inside ``directory`` (st_nlink - 2)."""
        return len(self.children.get(directory, ()))

    def subdirectory_names(self, directory: str) -> list[str]:
        return sorted(self.children.get(directory, ()))

    # ------------------------------------------------------------------ changes
    def add(self, seg: SegmentState) -> SegmentState:
        """Install a segment whose creation committed; returns the state to use (one a
        lookup loaded from the committed row meanwhile, if any: there is one state)."""
        held = self._by_id.get(seg.segment_id)
        if held is not None:
            seg = held
        else:
            self._register(seg)
            self.segment_count += 1
        self._use(seg)
        return seg

    def remove(self, seg: SegmentState) -> None:
        seg.deleted = True
        if self._by_name.get(seg.name) is seg:
            del self._by_name[seg.name]
        if self._by_id.get(seg.segment_id) is seg:
            del self._by_id[seg.segment_id]
        self._recent.pop(seg.segment_id, None)
        self.segment_count -= 1

    def load_directories(self, records: dict[str, DirectoryMeta]) -> None:
        for name, record in records.items():
            self.add_directory(name, record)

    def add_directory(self, name: str, record: DirectoryMeta) -> None:
        self.directories[name] = record
        self.children.setdefault(names.parent_of(name), set()).add(name)

    def remove_directory(self, name: str) -> None:
        parent = names.parent_of(name)
        siblings = self.children.get(parent)
        if siblings is not None:
            siblings.discard(name)
            if not siblings:
                del self.children[parent]
        del self.directories[name]

    def move(self, source: str, target: str) -> None:
        """Rename ``source`` (a segment, or a directory with everything below it) in
        memory, after the metadata commit that renamed it."""
        if source in self.directories:
            inner = sorted(d for d in self.directories if names.is_within(d, source))
            moved = {d: target + d[len(source):] for d in [source, *inner]}
            records = {d: self.directories[d] for d in moved}
            for directory in reversed([source, *inner]):
                self.remove_directory(directory)
            for before, after in moved.items():
                self.add_directory(after, records[before])
            segments = [s for s in self._by_name.values() if names.is_within(s.name, source)]
        else:
            seg = self._by_name.get(source)
            segments = [seg] if seg is not None else []
        for seg in segments:
            del self._by_name[seg.name]
        for seg in segments:
            seg.rename(target + seg.name[len(source):])
            self._by_name[seg.name] = seg
