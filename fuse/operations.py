"""``TierOperations``: the FUSE request handlers, mapping POSIX calls onto the store.

Directories are namespaces, files are segments. Semantics (append-only):
- a write at offset == the segment's appended length appends; O_APPEND writes always
  append; a write anywhere else fails with EPERM and changes nothing, unless it carries
  exactly the bytes already there (a retried write: a no-op, ``rewrites``);
- O_TRUNC / truncate of a non-empty segment fails with EPERM, unless its directory's
  policy has ``rewrite_replaces=1``: then truncating it to 0 replaces the name with a
  new empty segment (``rewrites.WholeFileRewrites``); truncate to the current length
  is a no-op;
- ``chmod a-w`` seals, ``chmod u+w`` unseals; writes to a sealed segment fail with EPERM;
  permission bits, owner and times (``chmod``, ``chown``, ``touch -d``, ``utimensat``)
  are stored (``store.set_attributes``; the kernel checks who may change them);
- ``rename`` onto an existing name replaces it atomically; a sealed segment only where
  the policy ``rewrite_replaces=1`` is set (EPERM elsewhere);
- an open descriptor holds its file (``MountedStore.hold``): it reads, writes and stats
  the file it opened while the name is renamed, replaced or deleted through any front
  end; a file deleted or replaced while open lives on, detached (``st_nlink`` 0), until
  its last descriptor closes. A whole-file rewrite moves every descriptor of the inode
  to the new file, as truncation does on a local disk;
- an inode whose file is gone answers ESTALE, so the kernel looks the name up again: an
  ``open`` racing a rename that replaces the name opens the old file or the new one;
- readdir lists ``.`` and ``..``; a directory's ``st_nlink`` is 2 + its subdirectories;
- ``fsync``/``fdatasync`` make every byte written so far durable, also on a VD segment;
- a created file is durable with the journal's next sync, as on a local file system:
  within ``vd_sync_interval_s``, and before the first PD write to it is acknowledged;
  ``fsync`` of the file or of its directory waits for it (``store.create_file``);
- ``st_size`` is the durable length: readers never see bytes a crash could take away;
- extended attributes ``user.tierfs.*`` report the segment's lengths and state;
  ``user.tierfs.durability`` can be set to ``pd``/``vd``/``tier2`` on an empty segment.

Invariants:
- Every handler is wrapped by ``errors.fuse_errors``: it raises only ``FUSEError``.
- Handlers run on the store's event loop and only await the store; nothing blocks the
  loop (statfs of the data dir runs in a worker thread).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from collections.abc import Sequence

import pyfuse3
import trio
from tierfs.fuse.errors import fuse_errors
from tierfs.fuse.inodes import FILE_INODE_UNIT, ROOT_INODE, InodeTable, file_inode
from tierfs.fuse.invalidation import KernelNotifier
from tierfs.fuse.named_files import NamedFile
from tierfs.fuse.rewrites import already_written
from tierfs.fuse.whole_file_rewrites import WholeFileRewrites
from tierfs.fuse.xattrs import ExtendedAttributes

from tierfs.contracts import names
from tierfs.contracts.api import SegmentReaderAPI
from tierfs.contracts.errors import (
    BadOffsetError,
    IsADirectoryError_,
    NotADirectoryError_,
    OffsetOutOfRangeError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.contracts.reports.info import DirectoryInfo, Info, SegmentInfo
from tierfs.store.served import HeldFile, MountedStore

# The kernel hears of every growth, attribute and name change the store makes at once
# (invalidation.py), so it may cache long: `ls -l` of a big directory stats each entry
# after reading them all, and with short timeouts every stat was a round trip.
ATTR_TIMEOUT_S = 60.0
ENTRY_TIMEOUT_S = 60.0
OPEN_ATTEMPTS = 3  # an open whose name is replaced between its stat and its hold retries
SHORT_TIMEOUT_S = 1.0  # a cluster's names change on other hosts too: nobody tells
BLOCK_SIZE_BYTES = 1 << 20  # st_blksize: tools size their I/O by it
DEFAULT_FILE_MODE = 0o644  # what the store reports when nothing was set
DEFAULT_DIRECTORY_MODE = 0o755


@dataclasses.dataclass
class OpenFile:
    inode: int
    always_append: bool  # opened with O_APPEND: every write goes to the end
    file: HeldFile  # what the descriptor reads and writes, whatever its name means later
    reader: SegmentReaderAPI | None = None
    # created with no write bit (git objects: 0444): the creator still writes through
    # this handle, the mode (and so the seal) is applied when it closes
    mode_on_close: int | None = None


def join(parent: str, name: bytes) -> str:
    component = os.fsdecode(name)
    return f"{parent}/{component}" if parent else component


class TierOperations(ExtendedAttributes, pyfuse3.Operations):
    supports_dot_lookup = False  # no NFS export: the kernel resolves . and ..
    enable_writeback_cache = False  # writes must reach the store in order, as written
    enable_acl = False

    def __init__(
        self, store: MountedStore, *, direct_io: bool = True, attr_timeout_s: float = ATTR_TIMEOUT_S,
        entry_timeout_s: float = ENTRY_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.store = store
        self.direct_io = direct_io
        self.attr_timeout_s = attr_timeout_s
        self.entry_timeout_s = entry_timeout_s
        self.inodes = InodeTable()
        self.notifier = KernelNotifier(self.inodes)  # mount.py wires it to the store's changes
        self.rewrites = WholeFileRewrites(store)
        self._files: dict[int, OpenFile] = {}
        self._open_by_inode: dict[int, list[OpenFile]] = {}
        self._directories: dict[int, list[tuple[str, Info]]] = {}
        self._next_handle = 1
        self._uid = os.getuid()  # the daemon's: owner of entries nobody chowned
        self._gid = os.getgid()

    # ---------------------------------------------------------------- attributes
    def attributes(self, inode: int, info: Info) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = self.entry_timeout_s
        attr.attr_timeout = self.attr_timeout_s
        attr.st_uid = info.uid
        attr.st_gid = info.gid
        attr.st_rdev = 0
        attr.st_blksize = BLOCK_SIZE_BYTES
        if isinstance(info, SegmentInfo):
            attr.st_mode = stat.S_IFREG | info.mode
            attr.st_nlink = 0 if names.is_detached(info.name) else 1
            attr.st_size = info.length
            attr.st_blocks = (info.length + 511) // 512
        else:
            attr.st_mode = stat.S_IFDIR | info.mode
            attr.st_nlink = 2 + info.subdirectories
            attr.st_size = 0
            attr.st_blocks = 0
        attr.st_atime_ns = info.atime_ns
        attr.st_mtime_ns = info.mtime_ns
        attr.st_ctime_ns = info.ctime_ns
        return attr

    async def _entry(self, name: str) -> pyfuse3.EntryAttributes:
        """Attributes of ``name`` for a reply that gives the kernel a lookup."""
        info = await self.store.stat(name)
        return self.attributes(self.inodes.looked_up(name, self._entry_inode(info)), info)

    def _entry_inode(self, info: Info) -> int | None:
        """An entry's inode number: its identity (``inodes.file_inode``: a segment's id,
        a directory's); None for the root and for a directory without one."""
        entry_id = info.segment_id if isinstance(info, SegmentInfo) else info.directory_id
        if not entry_id:
            return None
        inode: int = file_inode(self.store.id_space(info.name), entry_id)
        return inode

    async def _rewrite(self, inode: int, info: SegmentInfo, what: str) -> SegmentInfo:
        """A whole-file rewrite (``WholeFileRewrites``): a new segment under the name,
        which keeps the inode its descriptors and the kernel know for this mount's life
        (``InodeTable.kept_through_rewrite``); the inode's descriptors move to it."""
        replaced: SegmentInfo = await self.rewrites.replace_with_empty(info, what)
        self.inodes.kept_through_rewrite(info.name, self._entry_inode(replaced))
        for handle in self._open_by_inode.get(inode, []):
            old, handle.file, handle.reader = handle.file, await self._hold(inode, replaced.name), None
            await old.release()
        return replaced

    async def _hold(self, inode: int, name: str) -> HeldFile:
        """What a new descriptor of ``inode`` holds: the file called ``name`` now. ESTALE
        if it went meanwhile (a rename replaced it): the kernel looks the name up again."""
        try:
            held = await self.store.hold(name)
        except SegmentNotFoundError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None
        return held or NamedFile(self.store, lambda: self.inodes.name_of(inode))

    def _open_file_of(self, inode: int) -> HeldFile | None:
        """The file an open descriptor of ``inode`` holds (one not detached if any)."""
        handles = self._open_by_inode.get(inode)
        if not handles:
            return None
        return next((h.file for h in handles if not h.file.detached), handles[0].file)

    async def _info_of(self, inode: int) -> Info:
        """What ``inode`` is now: the file its descriptors hold, else what its name holds;
        ESTALE if that is no longer this inode's file (the kernel then looks it up again)."""
        file = self._open_file_of(inode)
        if file is not None:
            return await file.info()
        name = self.inodes.known_name(inode)
        if name is None:
            if inode >= FILE_INODE_UNIT:
                raise pyfuse3.FUSEError(errno.ESTALE)
            raise SegmentNotFoundError(f"inode {inode}")
        info = await self.store.stat(name)
        if inode >= FILE_INODE_UNIT and self.inodes.inode_of_file(self._entry_inode(info) or 0) != inode:
            raise pyfuse3.FUSEError(errno.ESTALE)
        return info

    async def _segment_info(self, inode: int) -> SegmentInfo:
        info = await self._info_of(inode)
        if not isinstance(info, SegmentInfo):
            raise IsADirectoryError_(info.name)
        return info

    # ---------------------------------------------------------------- lookups
    @fuse_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self._entry(join(self.inodes.name_of(parent_inode), name))

    @fuse_errors
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.inodes.forget(inode, count)

    @fuse_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        attr = self.attributes(inode, await self._info_of(inode))
        self._report_mode_on_close(inode, attr)
        return attr

    def _report_mode_on_close(self, inode: int, attr: pyfuse3.EntryAttributes) -> None:
        """A file created without write bits reports them from the start (its creating
        descriptor still writes: the kernel checked at the open)."""
        for handle in self._open_by_inode.get(inode, []):
            if handle.mode_on_close is not None:
                attr.st_mode = stat.S_IFREG | handle.mode_on_close

    @fuse_errors
    async def setattr(
        self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
        fh: int | None, ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        info = await self._info_of(inode)
        if names.is_detached(info.name):
            raise SegmentNotFoundError(f"inode {inode}")  # deleted while open: nothing to change by name
        if fields.update_size and (isinstance(info, DirectoryInfo) or attr.st_size != info.appended_length):
            if isinstance(info, DirectoryInfo) or attr.st_size != 0:
                raise pyfuse3.FUSEError(errno.EPERM)  # append-only: no truncation, no holes
            info = await self._rewrite(inode, info, "truncate to 0")
        name = info.name
        # metadata only; the kernel checked who may change what (default_permissions)
        change = {
            "mode": stat.S_IMODE(attr.st_mode) if fields.update_mode else None,
            "uid": attr.st_uid if fields.update_uid else None,
            "gid": attr.st_gid if fields.update_gid else None,
            "atime_ns": attr.st_atime_ns if fields.update_atime else None,
            "mtime_ns": attr.st_mtime_ns if fields.update_mtime else None,
        }
        if any(value is not None for value in change.values()):
            info = await self.store.set_attributes(name, **change)
        return self.attributes(inode, info)

    # ---------------------------------------------------------------- namespace
    @fuse_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = join(self.inodes.name_of(parent_inode), name)
        await self.rewrites.check_job_start(path)
        with self.notifier.made_here(path):
            await self.store.mkdir(path)
        await self._keep_creator(path, mode, DEFAULT_DIRECTORY_MODE, ctx)
        return await self._entry(path)

    async def _keep_creator(self, path: str, mode: int, default_mode: int, ctx: pyfuse3.RequestContext) -> bool:
        """A new entry gets the caller's mode (the kernel applied the umask) and owner;
        one more commit only when they differ from what the store reports anyway
        (returns whether it made one)."""
        bits = stat.S_IMODE(mode)
        if bits != default_mode or ctx.uid != self._uid or ctx.gid != self._gid:
            await self.store.set_attributes(path, mode=bits, uid=ctx.uid, gid=ctx.gid)
            return True
        return False

    @fuse_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = join(self.inodes.name_of(parent_inode), name)
        if isinstance(await self.store.stat(path), SegmentInfo):
            raise NotADirectoryError_(path)
        await self.store.rmdir(path)
        self.inodes.removed(path)

    @fuse_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = join(self.inodes.name_of(parent_inode), name)
        info = await self.store.stat(path)
        if isinstance(info, DirectoryInfo):
            raise IsADirectoryError_(path)
        await self.store.delete(path)  # a file open here lives on, detached, for its descriptors
        self.inodes.removed(path)
        self.rewrites.recovered(path)

    @fuse_errors
    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
        flags: int, ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)  # would need two renames at once
        old = join(self.inodes.name_of(parent_inode_old), name_old)
        new = join(self.inodes.name_of(parent_inode_new), name_new)
        await self.store.rename(old, new)  # replaces an existing target (POSIX)
        self.inodes.renamed(old, new)

    @fuse_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EOPNOTSUPP)  # only directories and segments exist

    @fuse_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EOPNOTSUPP)

    @fuse_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EOPNOTSUPP)

    # ---------------------------------------------------------------- directories
    @fuse_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        name = self.inodes.name_of(inode)
        entries = await self.store.list(name)
        parent = name.rpartition("/")[0]
        dots = [(".", await self.store.stat(name)), ("..", await self.store.stat(parent))]
        handle = self._new_handle()
        self._directories[handle] = [*dots, *((entry.name, entry) for entry in entries)]
        return handle

    @fuse_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._directories.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for index in range(start_id, len(entries)):
            name, info = entries[index]
            if name in (".", ".."):  # the kernel takes no lookup on these
                inode = self.inodes.known_inode(info.name) or ROOT_INODE
                if not pyfuse3.readdir_reply(token, os.fsencode(name), self.attributes(inode, info), index + 1):
                    return
                continue
            inode = self.inodes.looked_up(name, self._entry_inode(info))
            component = os.fsencode(name.rpartition("/")[2])
            if not pyfuse3.readdir_reply(token, component, self.attributes(inode, info), index + 1):
                self.inodes.forget(inode, 1)  # not delivered: no lookup for the kernel
                return

    @fuse_errors
    async def releasedir(self, fh: int) -> None:
        self._directories.pop(fh, None)

    # ---------------------------------------------------------------- files
    def _new_handle(self) -> int:
        handle = self._next_handle
        self._next_handle += 1
        return handle

    async def _open_handle(self, inode: int, flags: int, name: str) -> pyfuse3.FileInfo:
        file = await self._hold(inode, name)
        handle = self._new_handle()
        opened = OpenFile(inode, always_append=bool(flags & os.O_APPEND), file=file)
        self._files[handle] = opened
        self._open_by_inode.setdefault(inode, []).append(opened)
        self.inodes.opened(inode)
        return pyfuse3.FileInfo(fh=handle, direct_io=self.direct_io, keep_cache=False)

    @fuse_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        for attempt in range(OPEN_ATTEMPTS):
            info = await self._file_to_open(inode)
            if flags & os.O_ACCMODE != os.O_RDONLY:
                if info.sealed:
                    raise SegmentSealedError(info.name)
                if flags & os.O_TRUNC and info.appended_length > 0:
                    info = await self._rewrite(inode, info, "open with O_TRUNC")
            try:
                return await self._open_handle(inode, flags, info.name)
            except pyfuse3.FUSEError as e:  # the name was replaced meanwhile: open what it holds now
                if e.errno != errno.ESTALE or attempt == OPEN_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def _file_to_open(self, inode: int) -> SegmentInfo:
        """The file an ``open`` of ``inode`` opens: the inode's own, or, once a rename or
        deletion took that away, whatever the name the kernel resolved holds now. The
        kernel resolved the name to this inode an instant ago (a path walk holds no
        reference we could keep the file by), so the open is of the name, at an instant
        during the call: the old file or the new one, never ENOENT for a name that was
        never missing."""
        try:
            return await self._segment_info(inode)
        except pyfuse3.FUSEError as e:
            name = self.inodes.former_name(inode)
            if e.errno != errno.ESTALE or name is None:
                raise
        info = await self.store.stat(name)
        if not isinstance(info, SegmentInfo):
            raise IsADirectoryError_(name)
        return info

    @fuse_errors
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = join(self.inodes.name_of(parent_inode), name)
        mode_on_close = None
        info: Info | None = None  # what the reply reports, when nothing changed it since
        try:
            with self.notifier.made_here(path):
                info = await self.store.create_file(path)
            if not stat.S_IMODE(mode) & 0o222:
                mode_on_close, mode = stat.S_IMODE(mode), mode | stat.S_IWUSR
            if await self._keep_creator(path, mode, DEFAULT_FILE_MODE, ctx):
                info = None
        except SegmentExistsError:
            if flags & os.O_EXCL:
                raise
            info = await self.store.stat(path)  # created meanwhile: open it instead
            if not isinstance(info, SegmentInfo):
                raise IsADirectoryError_(path) from None
            if flags & os.O_TRUNC and info.appended_length > 0:
                known = self.inodes.known_inode(path)
                await self._rewrite(known if known is not None else 0, info, "create with O_TRUNC")
                info = None
        if info is None:
            info = await self.store.stat(path)
        attr = self.attributes(self.inodes.looked_up(path, self._entry_inode(info)), info)
        file_info = await self._open_handle(attr.st_ino, flags, path)
        self._files[file_info.fh].mode_on_close = mode_on_close
        self._report_mode_on_close(attr.st_ino, attr)
        return file_info, attr

    @fuse_errors
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._file(fh)
        if handle.reader is None or handle.reader.name != handle.file.name:
            handle.reader = handle.file.open_reader()
        try:
            return await handle.reader.read(off, size)
        except OffsetOutOfRangeError:
            return b""  # at or past the durable end: EOF

    @fuse_errors
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._file(fh)
        expected = None if handle.always_append else off
        try:
            await handle.file.append(buf, expected_offset=expected)
        except BadOffsetError as refused:
            if not await already_written(handle.file, refused, buf):
                raise
        return len(buf)

    @fuse_errors
    async def flush(self, fh: int) -> None:
        # close() promises nothing more than write() did (fsync does), so FLUSH has
        # nothing to do: ENOSYS makes the kernel stop sending it (fc->no_flush), one
        # round trip less per close. The kernel reports success to close() either way.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @fuse_errors
    async def release(self, fh: int) -> None:
        handle = self._files.pop(fh, None)
        if handle is None:
            return
        same_inode = self._open_by_inode[handle.inode]
        same_inode.remove(handle)
        if not same_inode:
            del self._open_by_inode[handle.inode]
        self.inodes.closed(handle.inode)
        file = handle.file
        await file.release()  # the last descriptor of a file deleted while open: it goes now
        if handle.mode_on_close is not None and not file.detached:
            name = self.inodes.known_name(handle.inode)
            if name is not None:
                await self.store.set_attributes(name, mode=handle.mode_on_close)

    @fuse_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._file(fh).file.sync()

    @fuse_errors
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.store.sync()  # the directory's entries: creations are journal frames

    def _file(self, fh: int) -> OpenFile:
        handle = self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return handle

    # ---------------------------------------------------------------- file system
    @fuse_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        disk = await trio.to_thread.run_sync(os.statvfs, self.store.config.data_dir)
        data = pyfuse3.StatvfsData()
        data.f_bsize = BLOCK_SIZE_BYTES
        data.f_frsize = disk.f_frsize
        data.f_blocks = disk.f_blocks
        data.f_bfree = disk.f_bfree
        data.f_bavail = disk.f_bavail
        data.f_files = self.store.statistics().segments + disk.f_ffree
        data.f_ffree = disk.f_ffree
        data.f_favail = disk.f_favail
        data.f_namemax = 255
        return data


__all__ = ["ROOT_INODE", "TierOperations"]
