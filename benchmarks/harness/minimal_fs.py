"""The minimal pyfuse3 filesystem: the least any Python FUSE filesystem does per request
on this machine, the ceiling (``fuse``) and the floor (``peers``) of tierfs's mount.

``python -m benchmarks.harness.minimal_fs MOUNTPOINT [--data-bytes N] [--direct-io]
[--journal-dir DIR] [--pd-syncs DIR]`` mounts with the tierfs mount's options (pyfuse3's
defaults, 60 s entry and attribute timeouts, ``direct_io`` if asked): ``data``, N bytes
of memory, each read one slice of one bytes; ``sink``, writes discarded; ``journal``,
each write passed on with one ``write(2)`` to a file in DIR (no sync; truncating starts a
new file), as tierfs's VD write does before it acknowledges; new files and directories
(appends only) in memory. With ``--pd-syncs`` each new file also does the disk work
tierfs's pd promise needs and nothing more: at CREATE one SQLite transaction (WAL,
``synchronous=NORMAL``) inserting its row and updating its directory's, and one
``write(2)`` of a creation record to a journal file; at WRITE one ``write(2)`` of the
bytes and one ``fdatasync``. Reads of new files and listings are not served; FLUSH gets
ENOSYS, as from tierfs. It runs until unmounted or SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sqlite3
import stat
import time
from pathlib import Path
from typing import cast

import pyfuse3
import trio

ROOT = cast(pyfuse3.InodeT, pyfuse3.ROOT_INODE)
DATA, SINK, JOURNAL = (cast(pyfuse3.InodeT, ROOT + n) for n in (1, 2, 3))
TIMEOUT_S = 60.0  # tierfs's entry and attribute timeouts


class Node:
    def __init__(self, inode: int, mode: int, data: bytes | bytearray | None = None) -> None:
        self.inode, self.mode, self.data = inode, mode, bytearray() if data is None else data
        self.children: dict[bytes, int] = {}
        self.times_ns = time.time_ns()


class PdSyncs:
    """The disk work of tierfs's pd create and write (module docstring)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(directory / "floor.db", isolation_level=None)
        for statement in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                          "CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY AUTOINCREMENT, parent INTEGER NOT NULL, "
                          "name BLOB NOT NULL, value BLOB NOT NULL)",
                          "CREATE TABLE IF NOT EXISTS directories (id INTEGER PRIMARY KEY, value BLOB NOT NULL)"):
            self.db.execute(statement)
        self.journal = os.open(directory / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def created(self, parent: int, name: bytes) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO names (parent, name, value) VALUES (?, ?, ?)", (parent, name, b"r" * 48))
        self.db.execute("INSERT INTO directories (id, value) VALUES (?, ?) ON CONFLICT (id) DO UPDATE "
                        "SET value=excluded.value", (parent, b"d" * 48))
        self.db.execute("COMMIT")
        os.write(self.journal, b"c" * 64 + name)  # the creation's journal record

    def written(self, data: bytes) -> None:
        os.write(self.journal, data)
        os.fdatasync(self.journal)


class MinimalOperations(pyfuse3.Operations):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.direct_io, self.journal_dir = args.direct_io, args.journal_dir
        self.syncs = PdSyncs(Path(args.pd_syncs)) if args.pd_syncs else None
        self.nodes = {ROOT: Node(ROOT, stat.S_IFDIR | 0o755)}
        self.sink_bytes = self.journal_files = 0
        self.journal_path, self.journal_fd = "", -1
        block = os.urandom(1 << 20)
        for inode, name, wanted in ((SINK, b"sink", True), (JOURNAL, b"journal", args.journal_dir is not None),
                                    (DATA, b"data", args.data_bytes > 0)):
            if wanted:
                data = (block * (args.data_bytes // len(block) + 1))[:args.data_bytes] if inode == DATA else None
                self.nodes[inode] = Node(inode, stat.S_IFREG | 0o644, data)
                self.nodes[ROOT].children[name] = inode
        if args.journal_dir is not None:
            self.new_journal_file()
        self.next_inode = JOURNAL + 1

    def new_journal_file(self) -> None:
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
            os.unlink(self.journal_path)
        self.journal_files += 1
        self.journal_path = os.path.join(self.journal_dir, f"ceiling-journal-{self.journal_files}")
        self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def node(self, inode: int) -> Node:
        if inode not in self.nodes:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.nodes[inode]

    def attributes(self, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino, attr.st_mode = cast(pyfuse3.InodeT, node.inode), cast(pyfuse3.ModeT, node.mode)
        attr.st_nlink = 2 if stat.S_ISDIR(node.mode) else 1
        attr.st_size = (self.sink_bytes if node.inode == SINK else os.fstat(self.journal_fd).st_size
                        if node.inode == JOURNAL else len(node.data))
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.times_ns
        attr.st_blksize = 1 << 20
        attr.entry_timeout = attr.attr_timeout = TIMEOUT_S
        return attr

    def new(self, parent_inode: int, name: bytes, mode: int) -> Node:
        parent = self.node(parent_inode)
        if name in parent.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if self.syncs is not None:
            self.syncs.created(parent_inode, name)
        node = self.nodes[self.next_inode] = Node(self.next_inode, mode)
        self.next_inode += 1
        parent.children[name], parent.times_ns = node.inode, node.times_ns
        return node

    def info(self, inode: int) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=cast(pyfuse3.FileHandleT, inode), direct_io=self.direct_io, keep_cache=False)

    async def lookup(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attributes(self.node(self.node(parent_inode).children.get(name, -1)))

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attributes(self.node(inode))

    async def setattr(self, inode: pyfuse3.InodeT, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: pyfuse3.FileHandleT | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == JOURNAL and fields.update_size and attr.st_size == 0:  # dd's O_TRUNC
            self.new_journal_file()
        return self.attributes(self.node(inode))

    async def mkdir(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attributes(self.new(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode)))

    async def create(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                     flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext
                     ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self.new(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode))
        return self.info(node.inode), self.attributes(node)

    async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return self.info(inode)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        return bytes(self.nodes[fh].data[off : off + size])

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        if fh == JOURNAL:
            return os.write(self.journal_fd, buf)
        if fh == SINK:
            self.sink_bytes = max(self.sink_bytes, off + len(buf))
            return len(buf)
        node = self.node(fh)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.minimal_fs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint")
    parser.add_argument("--data-bytes", type=int, default=0)
    parser.add_argument("--direct-io", action="store_true")
    parser.add_argument("--journal-dir")
    parser.add_argument("--pd-syncs", metavar="DIR")
    args = parser.parse_args()
    trio.run(serve, MinimalOperations(args), args.mountpoint)
