"""The data dir's emergency space: a file of ``RESERVE_BYTES`` allocated while the disk
has room, deleted the moment the metadata needs room the disk no longer has.

A full disk must not stop the store from opening (the new owner epoch is one SQLite
commit, and SQLite's WAL index needs a file of its own) nor stop the storage writer from
committing the flushes that let the journal give its space back. The journal fills the
disk only up to this file, so deleting it always frees room for those few pages.

Invariants:
- The file holds no data: deleting it, or finding it missing, loses nothing.
- ``ensure`` never raises for lack of space: a full disk just means no reserve yet.
- ``release`` is idempotent and returns whether any space came back.
- ``fallocate`` here is the one wrapper of fallocate(2) (ctypes, Linux); it raises
  ``OSError(ENOSYS)`` where there is none.
- The journal grows only while the reserve exists (``present``, kept in memory): it
  re-makes a released reserve before it takes more space, so what the reserve gave
  back goes to the metadata, not to the next append.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESERVE_NAME = "space.reserve"
RESERVE_BYTES = 1 << 20  # 1 MiB: an epoch commit, a flush commit and SQLite's 32 KiB -shm
CLAIM_ROOM_BYTES = 256 << 10  # the owner claim (tier-2 and data dir) and the epoch commit


def _load_fallocate() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):  # not Linux/glibc: no reservation
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    function.restype = ctypes.c_int
    return function


_fallocate = _load_fallocate()


def fallocate(fd: int, mode: int, offset_bytes: int, length_bytes: int) -> None:
    """fallocate(2); raises OSError with its errno (ENOSYS where it does not exist)."""
    if _fallocate is None:
        raise OSError(errno.ENOSYS, "fallocate is not available")
    if _fallocate(fd, mode, offset_bytes, length_bytes) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))




def is_no_space(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


class SpaceReserve:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / RESERVE_NAME
        self.present = False

    def ensure(self) -> bool:
        """Blocking: (re)create the reserve if missing; whether it exists now."""
        if self.present or self.path.exists():
            self.present = True
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                try:
                    fallocate(fd, 0, 0, RESERVE_BYTES)
                except OSError as e:
                    if is_no_space(e):
                        raise
                    os.posix_fallocate(fd, 0, RESERVE_BYTES)  # no fallocate(2): emulated
            finally:
                os.close(fd)
        except OSError as e:
            if not is_no_space(e):
                raise
            self.path.unlink(missing_ok=True)
            return False
        self.present = True
        return True

    def release(self) -> bool:
        """Blocking: delete the reserve; whether there was one."""
        self.present = False
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning("data dir disk full: released the %d-byte space reserve", RESERVE_BYTES)
        return True

    def release_if_free_below(self, free_bytes: int) -> None:
        """Blocking: release the reserve now if its disk has less than ``free_bytes``
        free, before writes that must not fail half-way (the owner claim at opening:
        a claim made on tier-2 but not recorded in the data dir would lock it out)."""
        stats = os.statvfs(self.path.parent)
        if stats.f_bavail * stats.f_frsize < free_bytes:
            self.release()
