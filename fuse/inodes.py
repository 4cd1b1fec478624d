"""Inode numbers for store names, with the kernel's lookup counts.

Invariants:
- The root directory (name ``""``) is ``pyfuse3.ROOT_INODE`` and is never forgotten.
- An entry's inode number is its identity (``file_inode``: a segment's id, or a
  directory's, in its id space; both come from one sequence), the same across renames,
  forgotten lookups, restarts and hosts; a lookup that finds another entry under a known
  name moves the name to that entry's inode. Only a directory without an id (served by
  an older daemon) is numbered below ``FILE_INODE_UNIT`` as it is first looked up. A whole-file
  rewrite (a new segment under the name) keeps the inode the kernel knows for as long
  as that inode is known (``kept_through_rewrite``); after a restart the file has its
  new segment's number.
- A name maps to at most one inode and an inode to at most one name; a rename moves
  the names of the entry and of everything below it, keeping their inodes.
- An inode stays known while the kernel holds a lookup on it or a file handle uses
  it; afterwards it is dropped, so the table's size follows the kernel's, not the
  number of names ever seen. Inode numbers are never reused within a mount.
- A removed name's inode stays valid for open handles (they hold their file) but
  answers ENOENT by name.
"""

from __future__ import annotations

import pyfuse3

from tierfs.contracts.errors import SegmentNotFoundError

ROOT_INODE = int(pyfuse3.ROOT_INODE)
FILE_INODE_UNIT = 1 << 40  # segment ids stay below it; directory inodes too


def file_inode(id_space: int, segment_id: int) -> int:
    """The inode number of a segment: ``id_space`` (0 on one host, the container in a
    cluster) above ``FILE_INODE_UNIT``, its id below."""
    return (id_space + 1) * FILE_INODE_UNIT + segment_id


class InodeTable:
    def __init__(self) -> None:
        self._name_by_inode: dict[int, str | None] = {ROOT_INODE: ""}
        self._inode_by_name: dict[str, int] = {"": ROOT_INODE}
        self._lookups: dict[int, int] = {}
        self._open_handles: dict[int, int] = {}
        self._former_names: dict[int, str] = {}  # an inode whose name was taken: that name
        self._rewritten: dict[int, int] = {}  # a rewrite's new file inode -> the inode kept
        self._rewrite_of: dict[int, int] = {}  # and back (one live rewrite per kept inode)
        self._next_inode = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._name_by_inode)

    def name_of(self, inode: int) -> str:
        """The current name of an inode (ENOENT if it was removed or is unknown)."""
        name = self._name_by_inode.get(inode)
        if name is None:
            raise SegmentNotFoundError(f"inode {inode}")
        return name

    def known_name(self, inode: int) -> str | None:
        return self._name_by_inode.get(inode)

    def former_name(self, inode: int) -> str | None:
        """The inode's name, or the last one it had while the kernel still knows it."""
        return self._name_by_inode.get(inode) or self._former_names.get(inode)

    def known_inode(self, name: str) -> int | None:
        return self._inode_by_name.get(name)

    def looked_up(self, name: str, file: int | None = None) -> int:
        """The inode for ``name`` (a file's ``file_inode``; a directory's allocated if
        new), its lookup count raised by one."""
        inode = self._inode_by_name.get(name)
        if file is not None:
            file = self._rewritten.get(file, file)
        if file is not None and inode != file:
            if inode is not None:  # the name now means another file (replaced elsewhere)
                self._unname(name, inode)
            elsewhere = self._name_by_inode.get(file)
            if elsewhere is not None and self._inode_by_name.get(elsewhere) == file:
                del self._inode_by_name[elsewhere]  # the file was renamed elsewhere
            inode = file
            self._inode_by_name[name] = inode
            self._name_by_inode[inode] = name
        elif inode is None:
            inode = self._next_inode
            self._next_inode += 1
            self._inode_by_name[name] = inode
            self._name_by_inode[inode] = name
        if inode != ROOT_INODE:
            self._lookups[inode] = self._lookups.get(inode, 0) + 1
        return inode

    def forget(self, inode: int, count: int) -> None:
        self._release(self._lookups, inode, count)

    def opened(self, inode: int) -> None:
        self._open_handles[inode] = self._open_handles.get(inode, 0) + 1

    def closed(self, inode: int) -> None:
        """One handle of ``inode`` closed."""
        self._release(self._open_handles, inode, 1)

    def is_open(self, inode: int) -> bool:
        return inode in self._open_handles

    def inode_of_file(self, file: int) -> int:
        """The inode the kernel knows for the file whose ``file_inode`` is ``file``: the
        file's own, or the one a rewrite kept."""
        return self._rewritten.get(file, file)

    def kept_through_rewrite(self, name: str, file: int | None) -> None:
        """``name``, whose inode is known, is a new segment (``file``) now: it keeps the
        inode."""
        inode = self._inode_by_name.get(name)
        if inode is not None and file is not None and inode != file:
            self._rewritten.pop(self._rewrite_of.get(inode, file), None)  # the file it replaced is gone
            self._rewritten[file], self._rewrite_of[inode] = inode, file

    def _release(self, counts: dict[int, int], inode: int, count: int) -> None:
        remaining = counts.get(inode, 0) - count
        if remaining > 0:
            counts[inode] = remaining
            return
        counts.pop(inode, None)
        self._drop_if_unused(inode)

    def removed(self, name: str) -> None:
        """``name`` no longer exists: its inode (if any) loses the name."""
        inode = self._inode_by_name.get(name)
        if inode is not None:
            self._unname(name, inode)

    def _unname(self, name: str, inode: int) -> None:
        del self._inode_by_name[name]
        self._name_by_inode[inode] = None
        self._former_names[inode] = name
        self._drop_if_unused(inode)

    def renamed(self, old: str, new: str) -> None:
        """``old`` (and everything below it) is now called ``new``."""
        self.removed(new)  # a stale inode of the target name loses it
        prefix = old + "/"
        moves = [(n, i) for n, i in self._inode_by_name.items() if n == old or n.startswith(prefix)]
        for name, _ in moves:
            del self._inode_by_name[name]
        for name, inode in moves:
            moved = new + name[len(old):]
            self._inode_by_name[moved] = inode
            self._name_by_inode[inode] = moved

    def _drop_if_unused(self, inode: int) -> None:
        if inode == ROOT_INODE or inode in self._lookups or inode in self._open_handles:
            return
        name = self._name_by_inode.pop(inode, None)
        self._former_names.pop(inode, None)
        self._rewritten.pop(self._rewrite_of.pop(inode, 0), None)
        if name is not None and self._inode_by_name.get(name) == inode:
            del self._inode_by_name[name]
