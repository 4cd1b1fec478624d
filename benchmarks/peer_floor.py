"""The floor of small-file creation through a Python FUSE filesystem on this machine,
for ``benchmarks peers``: what any pyfuse3 filesystem pays per file, with and without
the disk work tierfs's ``pd`` promise needs (one sync per file).

``python -m benchmarks.peer_floor MOUNTPOINT [--pd-syncs DIR]`` mounts a filesystem that
keeps names and bytes in memory and answers the requests creating a small file
(LOOKUP, CREATE, WRITE, RELEASE, GETATTR; MKDIR for the directory; FLUSH gets
ENOSYS, as from tierfs, so the kernel stops sending it) with the same
options as the tierfs mount: pyfuse3's default options (``default_permissions``),
``direct_io``, 60 s entry and attribute timeouts. With ``--pd-syncs`` it also does, in
the request's handler and nothing more, the disk work tierfs's pd durability needs per
file: at CREATE one SQLite transaction (WAL, ``synchronous=NORMAL``: no fsync)
inserting the name's row and updating its directory's row, and one ``write(2)`` of a
creation record to a journal file, as tierfs's create through the mount does; at WRITE
one ``write(2)`` of the bytes to that journal file and one ``fdatasync`` (which makes
the creation durable too), as tierfs's pd append waits for. Nothing goes to S3; reads, listings and appends to existing files
are not served (the peers benchmark runs only its small-file step on these systems).

Two systems of the peers table use it: ``pyfuse3-floor`` (no syncs) and
``pyfuse3-pd-floor`` (with them). Like ``local-disk`` they are ceilings, never the
"best peer": where the pd floor creates fewer files per second than the best peer, no
Python FUSE filesystem keeping tierfs's promise can reach that peer on this machine.

It runs until unmounted (``fusermount3 -u``) or SIGTERM.
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
from typing import Any, cast

import pyfuse3
import trio

from benchmarks.peer_mounts import ProcessSystem

ROOT = cast(pyfuse3.InodeT, pyfuse3.ROOT_INODE)
TIMEOUT_S = 60.0  # tierfs's ATTR_TIMEOUT_S and ENTRY_TIMEOUT_S
FLOOR = "pyfuse3-floor"
PD_FLOOR = "pyfuse3-pd-floor"
NOT_SERVED = "a floor for the small-file step only"


class _Node:
    __slots__ = ("inode", "mode", "data", "children", "times_ns")

    def __init__(self, inode: int, mode: int) -> None:
        self.inode = inode
        self.mode = mode
        self.data = bytearray()
        self.children: dict[bytes, int] = {}
        self.times_ns = time.time_ns()


class _PdSyncs:
    """The disk work of tierfs's pd create and write (module docstring)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(directory / "floor.db", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "parent INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS directories (id INTEGER PRIMARY KEY, value BLOB NOT NULL)")
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


class FloorOperations(pyfuse3.Operations):
    def __init__(self, syncs: _PdSyncs | None) -> None:
        super().__init__()
        self._syncs = syncs
        self._nodes = {ROOT: _Node(ROOT, stat.S_IFDIR | 0o755)}
        self._handles: dict[int, int] = {}  # file handle -> inode
        self._next_inode = ROOT + 1
        self._next_handle = 1

    def _attributes(self, node: _Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = cast(pyfuse3.InodeT, node.inode)
        attr.st_mode = cast(pyfuse3.ModeT, node.mode)
        attr.st_nlink = 2 if stat.S_ISDIR(node.mode) else 1
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_size = len(node.data)
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = node.times_ns
        attr.entry_timeout = attr.attr_timeout = TIMEOUT_S
        return attr

    def _node(self, inode: int) -> _Node:
        node = self._nodes.get(inode)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    def _new(self, parent_inode: int, name: bytes, mode: int) -> _Node:
        parent = self._node(parent_inode)
        if name in parent.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if self._syncs is not None:
            self._syncs.created(parent_inode, name)
        node = _Node(self._next_inode, mode)
        self._next_inode += 1
        self._nodes[node.inode] = node
        parent.children[name] = node.inode
        parent.times_ns = node.times_ns
        return node

    async def lookup(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        inode = self._node(parent_inode).children.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(self._nodes[inode])

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attributes(self._node(inode))

    async def mkdir(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attributes(self._new(parent_inode, name, stat.S_IFDIR | stat.S_IMODE(mode)))

    async def create(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, mode: pyfuse3.ModeT,
                     flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo,
                                                                                 pyfuse3.EntryAttributes]:
        node = self._new(parent_inode, name, stat.S_IFREG | stat.S_IMODE(mode))
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = node.inode
        info = pyfuse3.FileInfo(fh=cast(pyfuse3.FileHandleT, handle), direct_io=True, keep_cache=False)
        return info, self._attributes(node)

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        inode = self._handles.get(fh)
        if inode is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        node = self._nodes[inode]
        if off != len(node.data):
            raise pyfuse3.FUSEError(errno.EINVAL)  # append-only, as tierfs
        if self._syncs is not None:
            self._syncs.written(buf)
        node.data += buf
        node.times_ns = time.time_ns()
        return len(buf)

    async def flush(self, fh: pyfuse3.FileHandleT) -> None:
        raise pyfuse3.FUSEError(errno.ENOSYS)  # as tierfs: the kernel stops sending FLUSH

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        self._handles.pop(fh, None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--pd-syncs", metavar="DIR", help="do the disk work of tierfs's pd promise per file, in DIR")
    args = parser.parse_args(argv)
    syncs = _PdSyncs(Path(args.pd_syncs)) if args.pd_syncs else None
    pyfuse3.init(FloorOperations(syncs), args.mountpoint, set(pyfuse3.default_options) | {"fsname=peer-floor"})

    async def serve() -> None:
        async def until_unmounted(cancel_scope: trio.CancelScope) -> None:
            await pyfuse3.main()
            cancel_scope.cancel()  # unmounted: stop waiting for signals

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_unmounted, nursery.cancel_scope)
                async for _ in signals:
                    nursery.cancel_scope.cancel()

    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


class FloorSystem(ProcessSystem):
    """``pyfuse3-floor``: the floor filesystem in a process of its own (a ceiling)."""

    name = FLOOR
    cache_emptying = "new process (everything it holds is in its memory)"
    has_s3 = False
    small_files_only = True

    def create_bucket(self) -> None:
        """No bucket: nothing goes to S3."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peer_floor", str(self.mountpoint)]

    def environment(self) -> dict[str, str]:
        root = str(Path(__file__).resolve().parent.parent)
        return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}

    def fsync_mechanism(self) -> str:
        return "no S3"


class PdFloorSystem(FloorSystem):
    """``pyfuse3-pd-floor``: the floor plus the disk work of tierfs's pd promise per file."""

    name = PD_FLOOR

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.syncs_dir = self.directory / "syncs"

    def command(self) -> list[str]:
        return [*super().command(), "--pd-syncs", str(self.syncs_dir)]


FLOOR_SYSTEMS: dict[str, type[ProcessSystem]] = {FLOOR: FloorSystem, PD_FLOOR: PdFloorSystem}

if __name__ == "__main__":
    sys.exit(main())
