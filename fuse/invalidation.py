"""Tell the kernel when segments grow or change, so ``stat``, ``tail -f`` and ``cat`` see
new data, and when names come and go, so its entry cache never answers for a name the
store changed (through the mount, the API or the CLI alike).

The kernel caches a file's attributes and a directory's entries (``ATTR_TIMEOUT_S``,
``ENTRY_TIMEOUT_S``). When the store makes more bytes of a segment durable, or changes
its attributes, the inode (if the kernel knows it) gets its attributes invalidated; the
next ``stat`` or read past the cached end asks again, and a changed size makes the
kernel drop the file's cached pages, so no stale page (the zero-filled end of the old
last page) is ever served. When a name is created, removed or moved, its directory
entry is invalidated and its directory's attributes (mtime, st_nlink) too.

Invariants:
- ``segment_grew`` and ``name_changed`` run in the event loop from the store's
  callbacks: they only record the inode or entry; they never block and never raise.
- Notifications go out from a worker thread (``pyfuse3.invalidate_inode`` writes to
  /dev/fuse synchronously), in batches: many appends within ``COALESCE_S`` cost one
  notification per inode.
"""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3
import trio
from tierfs.fuse.inodes import InodeTable

log = logging.getLogger("tierfs.fuse")

COALESCE_S = 0.005


class KernelNotifier:
    def __init__(self, inodes: InodeTable) -> None:
        self._inodes = inodes
        self._pending: set[int] = set()
        self._pending_entries: set[tuple[int, bytes]] = set()  # (directory inode, name)
        self._wake = trio.Event()
        self.notifications = 0

    def segment_grew(self, name: str) -> None:
        inode = self._inodes.known_inode(name)
        if inode is not None:
            self._pending.add(inode)
            self._wake.set()

    def name_changed(self, name: str) -> None:
        directory, _, component = name.rpartition("/")
        directory_inode = self._inodes.known_inode(directory)
        if directory_inode is not None:
            self._pending_entries.add((directory_inode, os.fsencode(component)))
            self._pending.add(directory_inode)
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(COALESCE_S)
            inodes, self._pending = self._pending, set()
            entries, self._pending_entries = self._pending_entries, set()
            # invalidate_entry waits for the kernel's operations on that entry: never in
            # a handler, and abandoned at unmount rather than holding it up
            await trio.to_thread.run_sync(self._invalidate, inodes, entries, abandon_on_cancel=True)

    def _invalidate(self, inodes: set[int], entries: set[tuple[int, bytes]]) -> None:
        for directory_inode, component in entries:
            try:
                pyfuse3.invalidate_entry(pyfuse3.InodeT(directory_inode), component)
                self.notifications += 1
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTCONN):  # not cached, or unmounted
                    log.warning("invalidating entry %r of inode %d failed: %s", component, directory_inode, e)
        for inode in inodes:
            try:
                pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=True)
                self.notifications += 1
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTCONN):  # forgotten, or unmounted
                    log.warning("invalidating inode %d failed: %s", inode, e)
