"""Tell the kernel when segments grow or change, so ``stat``, ``tail -f`` and ``cat`` see
new data, and when names come and go, so its entry cache never answers for a name the
store changed (through the mount, the API or the CLI alike).

The kernel caches a file's attributes and a directory's entries (``ATTR_TIMEOUT_S``,
``ENTRY_TIMEOUT_S``). When the store makes more bytes of a segment durable, or changes
its attributes, the inode (if the kernel knows it) gets its attributes invalidated; the
next ``stat`` or read past the cached end asks again, and a changed size makes the
kernel drop the file's cached pages, so no stale page (the zero-filled end of the old
last page) is ever served. When a name is created, removed or moved, its directory
entry is invalidated and its directory's attributes (mtime, st_nlink) too, unless this
mount made the change itself (``made_here``): a create or mkdir reply gives the kernel the
new entry, and the kernel invalidates the parent's attributes itself (``fuse_dir_changed``),
so invalidating them again would only drop the entry it was just given (the inode is then
forgotten and looked up again) and cost two notifications per file created.

Invariants:
- ``segment_grew`` and ``name_changed`` run in the event loop from the store's
  callbacks: they only record the inode or entry; they never block and never raise.
- ``made_here`` skips the notification of exactly one change of that name made while the
  mount's handler runs; if the handler fails after another change of the name used the
  mark up (the name cannot change twice at once: the namespace lock orders them), that
  other change's notification is sent after all.
- Notifications go out from a worker thread (``pyfuse3.invalidate_inode`` writes to
  /dev/fuse synchronously), in batches: many appends within ``COALESCE_S`` cost one
  notification per inode.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

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
        self._made_here: set[str] = set()  # names this mount's handlers are changing right now
        self.notifications = 0

    def segment_grew(self, name: str) -> None:
        inode = self._inodes.known_inode(name)
        if inode is not None:
            self._pending.add(inode)
            self._wake.set()

    @contextmanager
    def made_here(self, name: str) -> Iterator[None]:
        """Around a handler that creates ``name`` through this mount: its change needs no
        notification (module docstring)."""
        self._made_here.add(name)
        try:
            yield
        except BaseException:
            if name not in self._made_here:  # another change of the name used the mark up
                self._queue_name(name)
            raise
        finally:
            self._made_here.discard(name)

    def name_changed(self, name: str) -> None:
        if name in self._made_here:
            self._made_here.discard(name)
            return
        self._queue_name(name)

    def _queue_name(self, name: str) -> None:
        inode = self._inodes.known_inode(name)
        if inode is not None:  # a file renamed away or deleted: its st_nlink changed
            self._pending.add(inode)
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
