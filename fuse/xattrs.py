"""Extended attributes on the mount: ``user.tierfs.*`` report a segment's lengths and
state (computed from ``stat`` and the chunk layout, never stored), and
``user.tierfs.durability`` chooses ``pd``/``vd``/``tier2`` for an empty segment.

Invariants:
- Only ``user.tierfs.durability`` can be set, and only while the segment is empty
  (EPERM once bytes were acknowledged under a level; EINVAL for an unknown level); the
  others are read-only facts (EPERM), other names are not stored: ENOATTR for other
  ``user.*`` names, EOPNOTSUPP outside the ``user`` namespace (what tools such as
  ``ls -l`` take as "this device has no SELinux labels or ACLs" and stop asking).
- Part of ``TierOperations`` (a mixin): its handlers are wrapped by ``fuse_errors``
  like every other handler.
"""

from __future__ import annotations

import errno
import os

import pyfuse3
from tierfs.fuse.errors import fuse_errors
from tierfs.fuse.inodes import InodeTable

from tierfs.contracts.config import DURABILITY_LEVELS
from tierfs.contracts.errors import IsADirectoryError_
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.store.served import MountedStore

XATTR_PREFIX = "user.tierfs."
XATTR_NAMES = ("durable_length", "flushed_length", "offloaded_length", "chunk_count",
               "sealed", "durability")


class ExtendedAttributes:
    store: MountedStore
    inodes: InodeTable

    # ---------------------------------------------------------------- xattrs
    async def _xattr_value(self, info: SegmentInfo, key: str) -> object:
        if key == "offloaded_length":  # the only one that needs the chunk list
            layout = await self.store.chunk_layout(info.name)
            return sum(c["end"] - c["start"] for c in layout if c["offloaded"])
        if key == "sealed":
            return "true" if info.sealed else "false"
        return getattr(info, key)

    @fuse_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        info = await self.store.stat(self.inodes.name_of(inode))
        if not isinstance(info, SegmentInfo):
            return []
        return [(XATTR_PREFIX + key).encode() for key in XATTR_NAMES]

    @fuse_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        full_name = os.fsdecode(name)
        key = full_name.removeprefix(XATTR_PREFIX)
        if not full_name.startswith("user."):
            # security.*, system.*, trusted.*: not supported here. ls -l asks every entry
            # for security.selinux and system.posix_acl_access, and stops asking for the
            # rest of the device once told "not supported" (ENODATA would cost two round
            # trips per entry: 100k entries, 10 s).
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        if key not in XATTR_NAMES or key == full_name:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        info = await self.store.stat(self.inodes.name_of(inode))
        if not isinstance(info, SegmentInfo):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return str(await self._xattr_value(info, key)).encode()

    @fuse_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        key = os.fsdecode(name)
        if key != XATTR_PREFIX + "durability":
            # the others are read-only facts; nothing else is stored
            raise pyfuse3.FUSEError(errno.EPERM if key.startswith(XATTR_PREFIX) else errno.EOPNOTSUPP)
        level = value.decode(errors="replace").strip()
        if level not in DURABILITY_LEVELS:
            raise pyfuse3.FUSEError(errno.EINVAL)
        info = await self.store.stat(self.inodes.name_of(inode))
        if not isinstance(info, SegmentInfo):
            raise IsADirectoryError_(info.name)
        if info.appended_length:  # fixed once bytes were acknowledged under it: not allowed, not invalid
            raise pyfuse3.FUSEError(errno.EPERM)
        await self.store.set_durability(info.name, level)

    @fuse_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        key = os.fsdecode(name)
        raise pyfuse3.FUSEError(errno.EPERM if key.startswith(XATTR_PREFIX) else pyfuse3.ENOATTR)


