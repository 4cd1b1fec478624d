"""A file layer that loses what was not synced: power loss for tests, as LazyFS does.

``python -m tierfs.testing.faults.lazyfs BACKING MOUNTPOINT`` mounts ``BACKING`` at
``MOUNTPOINT`` (FUSE, pyfuse3 on trio). Names (create, rename, unlink, mkdir) go to the
backing directory at once; file *data* does not: every write and truncate is kept in
memory, per file, until an ``fsync``/``fdatasync`` of that file applies them to the
backing file and syncs it. Reads see the kept writes over the backing bytes, as a page
cache does.

- SIGUSR1 is the power cut: every unsynced write is dropped, and the layer exits (the
  mount goes with it). What is in the backing directory then is what a disk would hold
  after a power loss with a cache that writes back only on sync.
- SIGUSR2 turns the disk full, and the next SIGUSR2 frees it again (the layer prints
  ``full`` or ``space`` once the change holds): while full, a write that grows a file,
  a create, a mkdir and a link fail with ENOSPC, as on a disk with no free block;
  writes inside a file's size, reads, syncs, unlinks and renames go on.
- SIGTERM and SIGINT are an orderly shutdown: unsynced writes are applied first.
- Once the mount serves, the process prints ``ready`` on stdout.

Invariants:
- A file's bytes in the backing directory change only inside an ``fsync`` of it (or an
  orderly shutdown): a write the kernel hands over and nobody syncs never reaches it.
- The layer itself never fails a write for lack of memory checks: it is for tests,
  whose journals and databases sync often.
- Unsynced writes stay while the file exists, open or not (a page cache's dirty pages
  outlive close(2)), and go with the file when it is deleted or renamed over, so a
  backing inode number reused by a new file never shows them.
- Directory fsyncs sync the backing directory (names are not kept back: that is the
  part LazyFS also passes through by default).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pyfuse3
import trio

log = logging.getLogger(__name__)

ROOT = pyfuse3.ROOT_INODE


class _Pending:
    """A file's unsynced writes and truncates, in order, over its backing bytes."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, bytes | None]] = []  # (offset, data) or (size, None): a truncate

    def size(self, backing_size: int) -> int:
        size = backing_size
        for offset, data in self.ops:
            size = offset if data is None else max(size, offset + len(data))
        return size

    def read(self, backing: bytes, backing_size: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` as the kept ops make them (``backing``:
        the backing file's bytes from ``offset``)."""
        size = backing_size
        view = bytearray(backing[:max(0, min(length, backing_size - offset))])
        for start, data in self.ops:
            if data is None:  # a truncate: cut, or extend with zeros
                size = start
                keep = max(0, min(len(view), size - offset))
                del view[keep:]
                continue
            end = start + len(data)
            size = max(size, end)
            lo, hi = max(start, offset), min(end, offset + length)
            if lo >= hi:
                continue
            if len(view) < hi - offset:
                view.extend(bytes(hi - offset - len(view)))
            view[lo - offset:hi - offset] = data[lo - start:hi - start]
        wanted = max(0, min(length, size - offset))
        if len(view) < wanted:
            view.extend(bytes(wanted - len(view)))
        return bytes(view[:wanted])

    def apply(self, fd: int) -> None:
        for offset, data in self.ops:
            if data is None:
                os.ftruncate(fd, offset)
            else:
                os.pwrite(fd, data, offset)
        self.ops.clear()


class LazyOperations(pyfuse3.Operations):
    def __init__(self, backing: Path) -> None:
        super().__init__()
        self._paths: dict[int, str] = {ROOT: str(backing)}
        self._lookups: dict[int, int] = {}
        self._pending: dict[int, _Pending] = {}
        self._fds: dict[int, int] = {}  # file handle -> backing fd
        self._inode_of_fh: dict[int, int] = {}
        self._fd_of_inode: dict[int, int] = {}  # one backing fd per open inode (for syncs)
        self._opens: dict[int, int] = {}
        self._dirs: dict[int, int] = {}
        self.full = False
        self._next_fh = 1

    # ---------------------------------------------------------------- inodes
    def _path(self, inode: int) -> str:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _child(self, parent: int, name: bytes) -> str:
        return os.path.join(self._path(parent), os.fsdecode(name))

    def _attributes(self, path: str, inode: int | None = None) -> pyfuse3.EntryAttributes:
        try:
            st = os.lstat(path)
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        inode = inode if inode is not None else (ROOT if path == self._paths[ROOT] else st.st_ino)
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = inode
        entry.generation = 0
        entry.entry_timeout = 0
        entry.attr_timeout = 0
        entry.st_mode = st.st_mode
        entry.st_nlink = st.st_nlink
        entry.st_uid = st.st_uid
        entry.st_gid = st.st_gid
        entry.st_rdev = st.st_rdev
        entry.st_size = st.st_size
        pending = self._pending.get(inode)
        if pending is not None and stat.S_ISREG(st.st_mode):
            entry.st_size = pending.size(st.st_size)
        entry.st_blksize = 4096
        entry.st_blocks = (entry.st_size + 511) // 512
        entry.st_atime_ns = st.st_atime_ns
        entry.st_mtime_ns = st.st_mtime_ns
        entry.st_ctime_ns = st.st_ctime_ns
        return entry

    def _remember(self, path: str) -> pyfuse3.EntryAttributes:
        entry = self._attributes(path)
        self._paths[entry.st_ino] = path
        self._lookups[entry.st_ino] = self._lookups.get(entry.st_ino, 0) + 1
        return entry

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if name == b".":
            return self._attributes(self._path(parent_inode), parent_inode)
        return self._remember(self._child(parent_inode, name))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            left = self._lookups.get(inode, 0) - count
            if left > 0:
                self._lookups[inode] = left
                continue
            self._lookups.pop(inode, None)
            if inode != ROOT and inode not in self._opens:
                self._let_go(inode)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attributes(self._path(inode), inode)

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        try:
            if fields.update_size:
                self._pending.setdefault(inode, _Pending()).ops.append((attr.st_size, None))
            if fields.update_mode:
                os.chmod(path, stat.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                os.chown(path, attr.st_uid if fields.update_uid else -1, attr.st_gid if fields.update_gid else -1)
            if fields.update_atime or fields.update_mtime:
                st = os.lstat(path)
                os.utime(path, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                   attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        return self._attributes(path, inode)

    # ---------------------------------------------------------------- directories
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        fh = self._new_fh()
        self._dirs[fh] = inode
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path = self._path(self._dirs[fh])
        entries = sorted(os.listdir(path))
        for index, name in enumerate(entries[start_id:], start=start_id):
            try:
                entry = self._attributes(os.path.join(path, name))
            except pyfuse3.FUSEError:
                continue
            if not pyfuse3.readdir_reply(token, os.fsencode(name), entry, index + 1):
                return
            self._paths.setdefault(entry.st_ino, os.path.join(path, name))
            self._lookups[entry.st_ino] = self._lookups.get(entry.st_ino, 0) + 1

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        fd = os.open(self._path(self._dirs[fh]), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._need_space()
        path = self._child(parent_inode, name)
        self._os(os.mkdir, path, stat.S_IMODE(mode))
        return self._remember(path)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._need_space()
        path = self._child(parent_inode, name)  # the daemon's Unix sockets are made here
        self._os(os.mknod, path, mode, rdev)
        return self._remember(path)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._os(os.rmdir, self._child(parent_inode, name))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        try:
            inode = os.lstat(path).st_ino
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        self._os(os.unlink, path)
        if inode not in self._opens:
            self._pending.pop(inode, None)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old, new = self._child(parent_inode_old, name_old), self._child(parent_inode_new, name_new)
        try:
            inode = os.lstat(old).st_ino
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        try:
            replaced: int | None = os.lstat(new).st_ino
        except OSError:
            replaced = None
        self._os(os.replace, old, new)
        self._paths[inode] = new
        if replaced is not None and replaced != inode and replaced not in self._opens:
            self._pending.pop(replaced, None)  # renamed over: that file is gone
            if replaced not in self._lookups:
                self._paths.pop(replaced, None)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        self._need_space()
        path = self._child(new_parent_inode, new_name)
        self._os(os.link, self._path(inode), path)
        return self._remember(path)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = os.statvfs(self._paths[ROOT])
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                     "f_favail", "f_namemax"):
            setattr(data, name, getattr(st, name))
        if self.full:
            data.f_bfree = data.f_bavail = 0
        return data

    def _need_space(self) -> None:
        if self.full:
            raise pyfuse3.FUSEError(errno.ENOSPC)

    # ---------------------------------------------------------------- files
    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _open_backing(self, inode: int, path: str) -> int:
        fh = self._new_fh()
        fd = self._fd_of_inode.get(inode)
        if fd is None:
            try:
                fd = self._fd_of_inode[inode] = os.open(path, os.O_RDWR)
            except OSError as e:
                raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        self._fds[fh] = fd
        self._inode_of_fh[fh] = inode
        self._opens[inode] = self._opens.get(inode, 0) + 1
        return fh

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        fh = self._open_backing(inode, self._path(inode))
        if flags & os.O_TRUNC:
            self._pending.setdefault(inode, _Pending()).ops.append((0, None))
        return pyfuse3.FileInfo(fh=fh)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._need_space()
        path = self._child(parent_inode, name)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | (flags & os.O_EXCL), stat.S_IMODE(mode)))
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        entry = self._remember(path)
        if flags & os.O_TRUNC:
            self._pending.setdefault(entry.st_ino, _Pending()).ops.append((0, None))
        return pyfuse3.FileInfo(fh=self._open_backing(entry.st_ino, path)), entry

    async def read(self, fh: int, off: int, size: int) -> bytes:
        fd, inode = self._fds[fh], self._inode_of_fh[fh]
        backing_size = os.fstat(fd).st_size
        backing = os.pread(fd, size, off)
        pending = self._pending.get(inode)
        if pending is None or not pending.ops:
            return backing
        return pending.read(backing, backing_size, off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        pending = self._pending.setdefault(self._inode_of_fh[fh], _Pending())
        if self.full and off + len(buf) > pending.size(os.fstat(self._fds[fh]).st_size):
            raise pyfuse3.FUSEError(errno.ENOSPC)
        pending.ops.append((off, bytes(buf)))
        return len(buf)

    async def fsync(self, fh: int, datasync: bool) -> None:
        fd, inode = self._fds[fh], self._inode_of_fh[fh]
        pending = self._pending.get(inode)
        if pending is not None:
            pending.apply(fd)
        os.fsync(fd)

    async def flush(self, fh: int) -> None:
        pass  # close(2) persists nothing

    async def release(self, fh: int) -> None:
        fd = self._fds.pop(fh)
        inode = self._inode_of_fh.pop(fh)
        left = self._opens[inode] - 1
        if left:
            self._opens[inode] = left
            return
        del self._opens[inode]
        os.close(fd)
        del self._fd_of_inode[inode]
        if inode not in self._lookups:
            self._let_go(inode)

    def _let_go(self, inode: int) -> None:
        """Neither the kernel nor a handle holds ``inode`` now. A file that still exists
        keeps its unsynced writes, as a page cache does, until a sync or the power cut
        (dropping them here once made a closed file read back its older bytes); a
        deleted one's go with it, before the backing file system can reuse its number."""
        path = self._paths.get(inode)
        if path is not None and inode in self._pending:
            try:
                if os.lstat(path).st_ino == inode:
                    return
            except OSError:
                pass
        self._paths.pop(inode, None)
        self._pending.pop(inode, None)

    # ---------------------------------------------------------------- power
    def apply_all(self) -> None:
        """An orderly shutdown: what was written reaches the backing files."""
        for inode, pending in list(self._pending.items()):
            if not pending.ops or inode not in self._paths:
                continue
            try:
                fd = os.open(self._paths[inode], os.O_RDWR)
            except OSError:
                continue  # unlinked meanwhile
            try:
                pending.apply(fd)
                os.fsync(fd)
            finally:
                os.close(fd)

    def power_cut(self) -> int:
        """Drop every unsynced write; how many bytes were dropped."""
        dropped = sum(len(data) for pending in self._pending.values() for _, data in pending.ops if data)
        self._pending.clear()
        return dropped

    @staticmethod
    def _os(call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None


async def serve(backing: Path, mountpoint: Path) -> None:
    operations = LazyOperations(backing)
    options = {*pyfuse3.default_options, "fsname=lazyfs", "auto_unmount"}
    options.discard("default_permissions")
    pyfuse3.init(operations, str(mountpoint), options)
    power_cut = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pyfuse3.main)
            print("ready", flush=True)
            with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM,
                                           signal.SIGINT) as signals:
                async for signum in signals:
                    if signum == signal.SIGUSR2:
                        operations.full = not operations.full
                        print("full" if operations.full else "space", flush=True)
                        continue
                    power_cut = signum == signal.SIGUSR1
                    break
            nursery.cancel_scope.cancel()
    finally:
        if power_cut:
            log.warning("power cut: %d unsynced bytes dropped", operations.power_cut())
        else:
            operations.apply_all()
        pyfuse3.close(unmount=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.faults.lazyfs", description=__doc__.split("\n")[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="lazyfs: %(message)s")
    trio.run(serve, args.backing, args.mountpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
