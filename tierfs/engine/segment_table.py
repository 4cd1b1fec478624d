"""The in-memory namespace: every segment's state by name and by id, every directory's
record, and the root directory's record.

Invariants:
- Keys are canonical names (``names.canonical``): a hit needs no validation.
- A segment is in ``by_name`` exactly when it is in ``by_id``, under its current name.
- ``children`` indexes every segment and directory under its parent directory ('' is
  the root), so listing a directory and renaming a subtree cost what is in it, not
  what is in the store; directories change only through ``add_directory`` /
  ``remove_directory`` / ``load_directories`` / ``move``, which keep it.
- The table changes only after the metadata commit that made the change succeeded;
  callers hold the namespace lock for every change that spans entries.
- Once closed, every lookup raises ``StoreClosedError``.
"""

from __future__ import annotations

import dataclasses

import trio

from tierfs.contracts import names
from tierfs.contracts.errors import (
    IsADirectoryError_,
    NotADirectoryError_,
    SegmentNotFoundError,
    StoreClosedError,
)
from tierfs.engine.record_types import DirectoryMeta
from tierfs.engine.segment_state import SegmentState


class SegmentTable:
    def __init__(self) -> None:
        self.by_name: dict[str, SegmentState] = {}
        self.by_id: dict[int, SegmentState] = {}
        self.directories: dict[str, DirectoryMeta] = {}  # by name ('' not included)
        self.children: dict[str, set[str]] = {}  # directory ('' root) -> names directly in it
        self.subdirectory_counts: dict[str, int] = {}  # directory -> directories directly in it
        self.root_directory = DirectoryMeta()  # loaded when the store opens
        # serializes namespace changes (create, mkdir, rmdir, rename, delete, concat)
        self.lock = trio.Lock()
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError("the store is closed")

    # ------------------------------------------------------------------ lookups
    def segment(self, name: str) -> SegmentState:
        """The live segment called ``name``; ``SegmentNotFoundError`` or
        ``IsADirectoryError_`` otherwise."""
        self.check_open()
        seg = self.by_name.get(name)
        if seg is not None:
            return seg
        canonical = names.canonical(name)
        seg = self.by_name.get(canonical)
        if seg is None:
            if canonical in self.directories:
                raise IsADirectoryError_(canonical)
            raise SegmentNotFoundError(canonical)
        return seg

    def get(self, name: str) -> SegmentState | None:
        return self.by_name.get(name)

    def segment_by_id(self, segment_id: int) -> SegmentState | None:
        return self.by_id.get(segment_id)

    def segments(self) -> list[SegmentState]:
        return list(self.by_name.values())

    def taken(self, name: str) -> bool:
        return name in self.by_name or name in self.directories

    def is_directory(self, name: str) -> bool:
        return name == "" or name in self.directories

    def require_directory(self, name: str) -> None:
        """``name`` ('' is the root) is a directory, else the error a user expects."""
        if name and name not in self.directories:
            if name in self.by_name:
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

    def children_of(self, directory: str) -> list[str]:
        """Names directly inside ``directory`` (segments and directories), sorted."""
        return sorted(self.children.get(directory, ()))

    # ------------------------------------------------------------------ changes
    def subdirectories_of(self, directory: str) -> int:
        """How many directories are directly inside ``directory`` (st_nlink - 2)."""
        return self.subdirectory_counts.get(directory, 0)

    def _link(self, name: str, is_directory: bool = False) -> None:
        parent = names.parent_of(name)
        self.children.setdefault(parent, set()).add(name)
        if is_directory:
            self.subdirectory_counts[parent] = self.subdirectory_counts.get(parent, 0) + 1

    def _unlink(self, name: str) -> None:
        parent = names.parent_of(name)
        siblings = self.children.get(parent)
        if siblings is not None:
            siblings.discard(name)
            if not siblings:
                del self.children[parent]
        if name in self.directories:
            remaining = self.subdirectory_counts.get(parent, 0) - 1
            if remaining > 0:
                self.subdirectory_counts[parent] = remaining
            else:
                self.subdirectory_counts.pop(parent, None)

    def add(self, seg: SegmentState) -> None:
        self.by_name[seg.name] = seg
        self.by_id[seg.segment_id] = seg
        self._link(seg.name)

    def remove(self, seg: SegmentState) -> None:
        seg.deleted = True
        del self.by_name[seg.name]
        del self.by_id[seg.segment_id]
        self._unlink(seg.name)

    def load_directories(self, records: dict[str, DirectoryMeta]) -> None:
        for name, record in records.items():
            self.add_directory(name, record)

    def add_directory(self, name: str, record: DirectoryMeta) -> None:
        self.directories[name] = record
        self._link(name, is_directory=True)

    def remove_directory(self, name: str) -> None:
        self._unlink(name)
        del self.directories[name]

    def _subtree(self, directory: str) -> list[str]:
        found, pending = [], [directory]
        while pending:
            for child in self.children.get(pending.pop(), ()):
                found.append(child)
                if child in self.directories:
                    pending.append(child)
        return found

    def move(self, source: str, target: str) -> None:
        """Rename ``source`` (a segment, or a directory with everything below it)."""
        moves = [(source, target)]
        if source in self.directories:
            moves += [(name, target + name[len(source):]) for name in self._subtree(source)]
        for before, _ in moves:
            self._unlink(before)
        for before, after in moves:
            self._link(after, is_directory=before in self.directories)
            if before in self.directories:
                self.directories[after] = self.directories.pop(before)
            else:
                seg = self.by_name.pop(before)
                seg.row = dataclasses.replace(seg.row, name=after)
                self.by_name[after] = seg
