"""The ceiling of FUSE in Python on this machine: a minimal pyfuse3 filesystem.

``python -m benchmarks.fuse_ceiling MOUNTPOINT SIZE_BYTES [--direct-io] [--journal-dir
DIR]`` mounts a filesystem with two files: ``data`` (SIZE_BYTES of memory, served by
slicing one ``bytes`` object) and ``sink`` (writes are acknowledged and discarded). It
does no more work per request than any pyfuse3 filesystem must, with the same
``FileInfo`` options as the tierfs mount, so ``dd`` against it measures the kernel,
libfuse and pyfuse3 on this machine.

With ``--journal-dir`` a third file, ``journal``, passes every write on to
a file in DIR with one ``write(2)`` (O_APPEND, no sync; truncating ``journal`` starts a
new file and deletes the old one, as tierfs writes new journal files): the least a
filesystem that keeps the bytes on the data disk must do per request, as tierfs's VD
write does before it acknowledges.

It runs until unmounted (``fusermount3 -u``) or SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
from typing import cast

import pyfuse3
import trio

ROOT = cast(pyfuse3.InodeT, pyfuse3.ROOT_INODE)
DATA_INODE = cast(pyfuse3.InodeT, ROOT + 1)
SINK_INODE = cast(pyfuse3.InodeT, ROOT + 2)
JOURNAL_INODE = cast(pyfuse3.InodeT, ROOT + 3)
JOURNAL_NAME = "ceiling-journal"


class CeilingOperations(pyfuse3.Operations):
    def __init__(self, size: int, direct_io: bool, journal_dir: str | None = None) -> None:
        super().__init__()
        self.data = (os.urandom(1 << 20) * (size // (1 << 20) + 1))[:size]
        self.direct_io = direct_io
        self.sink_bytes = 0
        self.names = {b"data": DATA_INODE, b"sink": SINK_INODE}
        self.journal_dir = journal_dir
        self.journal_files = 0
        self.journal_path = ""
        self.journal_fd = -1
        if journal_dir is not None:
            self._new_journal_file()
            self.names[b"journal"] = JOURNAL_INODE

    def _new_journal_file(self) -> None:
        assert self.journal_dir is not None
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
            os.unlink(self.journal_path)
        self.journal_files += 1
        self.journal_path = os.path.join(self.journal_dir, f"{JOURNAL_NAME}-{self.journal_files}")
        self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def _attr(self, inode: pyfuse3.InodeT) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.entry_timeout = attr.attr_timeout = 60
        if inode == ROOT:
            attr.st_mode = stat.S_IFDIR | 0o755
            attr.st_nlink = 2
        else:
            attr.st_mode = stat.S_IFREG | 0o644
            attr.st_nlink = 1
            if inode == DATA_INODE:
                attr.st_size = len(self.data)
            elif inode == JOURNAL_INODE:
                attr.st_size = os.fstat(self.journal_fd).st_size
            else:
                attr.st_size = self.sink_bytes
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_blksize = 1 << 20
        return attr

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def lookup(self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT,
                     ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if parent_inode != ROOT or name not in self.names:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(self.names[name])

    async def setattr(self, inode: pyfuse3.InodeT, attr: pyfuse3.EntryAttributes,
                      fields: pyfuse3.SetattrFields, fh: pyfuse3.FileHandleT | None,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == JOURNAL_INODE and fields.update_size and attr.st_size == 0:
            self._new_journal_file()
        return self._attr(inode)  # dd's O_TRUNC

    async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=cast(pyfuse3.FileHandleT, inode), direct_io=self.direct_io,
                                keep_cache=False)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        return self.data[off : off + size]

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        if fh == JOURNAL_INODE:
            return os.write(self.journal_fd, buf)
        self.sink_bytes = max(self.sink_bytes, off + len(buf))
        return len(buf)


async def serve(mountpoint: str, size: int, direct_io: bool, journal_dir: str | None) -> None:
    pyfuse3.init(CeilingOperations(size, direct_io, journal_dir), mountpoint,
                 {*pyfuse3.default_options, "fsname=fuse-ceiling", "auto_unmount"})
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
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuse_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint")
    parser.add_argument("size_bytes", type=int)
    parser.add_argument("--direct-io", action="store_true")
    parser.add_argument("--journal-dir")
    args = parser.parse_args(argv)
    trio.run(serve, args.mountpoint, args.size_bytes, args.direct_io, args.journal_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
