"""Journal disk space: reserved before a frame is accepted, given back once flushed.

A full data-dir disk must refuse an append *before* anything changed (``NoSpaceError``)
instead of failing the group-commit write(2) that carries other appenders' frames too.
So the journal reserves the blocks a frame will occupy when the frame is queued
(``fallocate`` with ``FALLOC_FL_KEEP_SIZE``), and write(2) only fills blocks that exist.

Invariants:
- A reservation never changes a file's size: recovery sees only written frames, never
  reserved zeros.
- ``ensure`` either leaves the blocks up to ``end_bytes`` allocated or raises
  ``NoSpaceError`` having changed nothing; a later call retries, so appends resume by
  themselves once space is freed.
- A file system without fallocate (``EOPNOTSUPP``) is not reserved on: a write(2) there
  can still hit ENOSPC, which the journal cuts back to its last whole frame.
- The journal takes more space only while the data dir's space reserve exists (re-made
  first if the metadata released it), so the metadata always has room to commit the
  flushes that let the journal shrink.
- Releasing (on roll) punches only bytes past the file's size: never a written frame.
"""

from __future__ import annotations

import errno
from pathlib import Path

from tierfs.contracts.errors import NoSpaceError
from tierfs.engine.space_reserve import SpaceReserve, fallocate

RESERVE_AHEAD_BYTES = 1 << 20  # one fallocate per MiB of appends, not one per append
# The current file rolls early once it holds this many flushed bytes (or a whole file's
# worth, if smaller), so flushed journal bytes go back to the disk within one roll
# instead of waiting for a 64 MiB file to fill; at most one roll per 4 MiB flushed.
RECLAIM_AFTER_BYTES = 4 << 20

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class SpaceReserver:
    """The reservation of the journal file being written (one file at a time)."""

    def __init__(self, directory: Path, emergency: SpaceReserve | None = None) -> None:
        self._directory = directory
        self._emergency = emergency
        self.reserved_end_bytes = 0  # blocks of the current file allocated up to here
        self.supported = True  # until fallocate says otherwise

    def new_file(self) -> None:
        self.reserved_end_bytes = 0

    def ensure(self, fd: int, end_bytes: int) -> None:
        """Allocate the current file's blocks up to ``end_bytes`` (plus a step ahead)."""
        if not self.supported or end_bytes <= self.reserved_end_bytes:
            return
        start = self.reserved_end_bytes
        if self._emergency is not None and not self._emergency.ensure():
            raise NoSpaceError(str(self._directory), end_bytes - start)
        for target in (end_bytes + RESERVE_AHEAD_BYTES, end_bytes):
            try:
                fallocate(fd, _FALLOC_FL_KEEP_SIZE, start, target - start)
            except OSError as e:
                if e.errno in _UNSUPPORTED:
                    self.supported = False
                    return
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                continue  # try the exact size before refusing
            self.reserved_end_bytes = target
            return
        raise NoSpaceError(str(self._directory), end_bytes - start)

    def release(self, fd: int, size_bytes: int) -> None:
        """Give back what was reserved past ``size_bytes`` (the file stops growing)."""
        if self.supported and self.reserved_end_bytes > size_bytes:
            try:
                fallocate(
                    fd,
                    _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                    size_bytes,
                    self.reserved_end_bytes - size_bytes,
                )
            except OSError:
                pass  # the file is deleted once flushed anyway
        self.reserved_end_bytes = 0
