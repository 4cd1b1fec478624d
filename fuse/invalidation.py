"""Tell the kernel when segments grow, so ``stat``, ``tail -f`` and ``cat`` see new data.

The kernel caches a file's attributes (``ATTR_TIMEOUT_S``). When the store makes more
bytes of a segment durable, the segment's inode (if the kernel knows it) gets its
attributes invalidated; the next ``stat`` or read past the cached end asks again, and
a changed size makes the kernel drop the file's cached pages, so no stale page (the
zero-filled end of the old last page) is ever served.

Invariants:
- ``segment_grew`` runs in the event loop from the store's growth callback: it only
  records the inode; it never blocks and never raises.
- Notifications go out from a worker thread (``pyfuse3.invalidate_inode`` writes to
  /dev/fuse synchronously), in batches: many appends within ``COALESCE_S`` cost one
  notification per inode.
"""

from __future__ import annotations

import errno
import logging

import pyfuse3
import trio
from tierfs.fuse.inodes import InodeTable

log = logging.getLogger("tierfs.fuse")

COALESCE_S = 0.005


class KernelNotifier:
    def __init__(self, inodes: InodeTable) -> None:
        self._inodes = inodes
        self._pending: set[int] = set()
        self._wake = trio.Event()
        self.notifications = 0

    def segment_grew(self, name: str) -> None:
        inode = self._inodes.known_inode(name)
        if inode is not None:
            self._pending.add(inode)
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(COALESCE_S)
            inodes, self._pending = self._pending, set()
            await trio.to_thread.run_sync(self._invalidate, inodes)

    def _invalidate(self, inodes: set[int]) -> None:
        for inode in inodes:
            try:
                pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=True)
                self.notifications += 1
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTCONN):  # forgotten, or unmounted
                    log.warning("invalidating inode %d failed: %s", inode, e)
