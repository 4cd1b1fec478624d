"""The minimal pyfuse3 filesystem: the least any Python FUSE filesystem does per request
on this machine, the ceiling (``fuse``) and the floor (``peers``) of tierfs's mount.

``python -m benchmarks.harness.minimal_fs MOUNTPOINT [--data-bytes N] [--direct-io]
[--journal-dir DIR] [--pd-syncs DIR]`` mounts, with the options of the tierfs mount
(pyfuse3's defaults, 60 s entry and attribute timeouts, ``direct_io`` if asked):

- ``data`` (with ``--data-bytes``): N bytes of memory, each read one slice of one bytes;
- ``sink``: writes acknowledged and discarded;
- ``journal`` (with ``--journal-dir``): each write passed on to a file in DIR with one
  ``write(2)`` (O_APPEND, no sync; truncating starts a new file), as tierfs's VD write
  does before it acknowledges;
- new files and directories (CREATE, MKDIR; appends only), names and bytes in memory.
  With ``--pd-syncs`` each also does the disk work tierfs's pd promise needs per small
  file and nothing more: at CREATE one SQLite transaction (WAL, ``synchronous=NORMAL``:
  no fsync) inserting its row and updating its directory's, and one ``write(2)`` of a
  creation record to a journal file; at WRITE one ``write(2)`` of the bytes to it and
  one ``fdatasync``.

Reads of new files and listings are not served; FLUSH gets ENOSYS, as from tierfs. It
runs until unmounted (``fusermount3 -u``) or SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import cast

import pyfuse3
import trio

ROOT = cast(pyfuse3.InodeT, pyfuse3.ROOT_INODE)
DATA, SINK, JOURNAL = (cast(pyfuse3.InodeT, ROOT + n) for n in (1, 2, 3))
TIMEOUT_S = 60.0  # tierfs's entry and attribute timeouts


class _Node:
    __slots__ = ("inode", "mode", "data", "children", "times_ns")

    def __init__(self, inode: int, mode: int, data: bytes = b"") -> None:
        self.inode, self.mode, self.data = inode, mode, bytearray(data) if not data else data
        self.children: dict[bytes, int] = {}
        self.times_ns = time.time_ns()


class _PdSyncs:
    """The disk work of tierfs's pd create and write (module docstring)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(directory / "floor.db", isolation_level=None)
        for statement in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                          "CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                          "parent INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS directories (id INTEGER PRIMARY KEY, value BLOB NOT NULL)"):
            self._db.execute(statement)
        self._journal = os.open(directory / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def created(self, parent: int, name: bytes) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("INSERT INTO names (parent, name, value) VALUES (?, ?, ?)", (parent, name, b"r" * 48))
        self._db.execute("INSERT INTO directories (id, value) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
                         "SET value=excluded.value", (parent, b"d" * 48))
        self._db.execute("COMMIT")
        os.write(self._journal, b"c" * 64 + name)  # the creation's journal record

    def written(self, data: bytes) -> None:
        os.write(self._journal, data)
        os.fdatasync(self._journal)


class MinimalOperations(pyfuse3.Operations):
    def __init__(self, data_bytes: int, direct_io: bool, journal_dir: str | None, syncs: _PdSyncs | None) -> None:
        super().__init__()
        self.direct_io, self.journal_dir, self.syncs = direct_io, journal_dir, syncs
        self.nodes = {ROOT: _Node(ROOT, stat.S_IFDIR | 0o755), SINK: _Node(SINK, stat.S_IFREG | 0o644)}
        self.nodes[ROOT].children[b"sink"] = SINK
        if data_bytes:
            block = os.urandom(1 << 20)
            self.nodes[DATA] = _Node(DATA, stat.S_IFREG | 0o644, (block * (data_bytes // len(block) + 1))[:data_bytes])
            self.nodes[ROOT].children[b"data"] = DATA
        self.sink_bytes = self.journal_files = 0
        self.journal_path, self.journal_fd = "", -1
        if journal_dir is not None:
            self.nodes[JOURNAL] = _Node(JOURNAL, stat.S_IFREG | 0o644)
            self.nodes[ROOT].children[b"journal"] = JOURNAL
            self._new_journal_file()
        self.next_inode = JOURNAL + 1

    def _new_journal_file(self) -> None:
        assert self.journal_dir is not None
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
            os.unlink(self.journal_path)
        self.journal_files += 1
        self.journal_path = os.path.join(self.journal_dir, f"ceiling-journal-{self.journal_files}")
        self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def _node(self, inode: int) -> _Node:
        if inode not in self.nodes:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.nodes[inode]

    def _attributes(self, node: _Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = cast(pyfuse3.InodeT, node.inode)
        attr.st_mode = cast(pyfuse3.ModeT, node.mode)
        attr.st_nlink = 2 if stat.S_ISDIR(node.mode) else 1
        attr.st_size = (self.sink_bytes if node.inode == SINK else os.fstat(self.journal_fd).st_size
                        if node.inode == JOURNAL else len(node.data))
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.times_ns
        attr.st_blksize = 1 << 20
        attr.entry_timeout = attr.attr_timeout = TIMEOUT_S
        return attr

    def _new(self, parent_inode: int, name: bytes, mode: int) -> _Node:
        parent = self._node(parent_inode)
        if name in parent.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if self.syncs is not None:
            self.syncs.created(parent_inode, name)
        node = self.nodes[self.next_inode] = _Node(self.next_inode, mode)
        self.next_inode += 1
        parent.children[name] = node.inode
        parent.times_ns = node.times_ns
        return node

    async def lookup(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        inode = self._node(parent_inode).children.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(self.nodes[inode])

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attributes(self._node(inode))

    async def setattr(self, inode: pyfuse3.InodeT, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: pyfuse3.FileHandleT | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == JOURNAL and fields.update_size and attr.st_size == 0:
            self._new_journal_file()
        return self._attributes(self._node(inode))  # dd's O_TRUNC

    async def mkdir(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attributes(self._new(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode)))

    async def create(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                     flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self._new(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode))
        return self._info(node.inode), self._attributes(node)

    def _info(self, inode: int) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=cast(pyfuse3.FileHandleT, inode), direct_io=self.direct_io, keep_cache=False)

    async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return self._info(inode)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        return bytes(self.nodes[fh].data[off : off + size])

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        if fh == JOURNAL:
            return os.write(self.journal_fd, buf)
        if fh == SINK:
            self.sink_bytes = max(self.sink_bytes, off + len(buf))
            return len(buf)
        node = self._node(fh)
        if off != len(node.data):
            raise pyfuse3.FUSEError(errno.EINVAL)  # append-only, as tierfs
        if self.syncs is not None:
            self.syncs.written(buf)
        node.data += buf
        node.times_ns = time.time_ns()
        return len(buf)

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        pass


async def serve(operations: MinimalOperations, mountpoint: str) -> None:
    pyfuse3.init(operations, mountpoint, {*pyfuse3.default_options, "fsname=minimal-fs", "auto_unmount"})
    try:
        async with trio.open_nursery() as nursery:
            async def terminate_on_signal() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(terminate_on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
    finally:
        pyfuse3.close(unmount=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.minimal_fs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint")
    parser.add_argument("--data-bytes", type=int, default=0)
    parser.add_argument("--direct-io", action="store_true")
    parser.add_argument("--journal-dir")
    parser.add_argument("--pd-syncs", metavar="DIR")
    args = parser.parse_args(argv)
    syncs = _PdSyncs(Path(args.pd_syncs)) if args.pd_syncs else None
    trio.run(serve, MinimalOperations(args.data_bytes, args.direct_io, args.journal_dir, syncs), args.mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
