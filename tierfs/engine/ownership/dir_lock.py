"""Exclusive ownership of a data directory.

Invariants:
- At most one process holds ``<data_dir>/LOCK`` (``flock``); the lock dies with its
  process, so kill -9 never leaves a stale lock behind.
- The holder's pid is written into the lock file so a refused opener can say who owns it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tierfs.contracts.datadir import LOCK_NAME
from tierfs.contracts.errors import StoreInUseError

LOCK_FILE = LOCK_NAME


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd = -1

    def acquire(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise StoreInUseError(str(self.data_dir), int(holder) if holder.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = -1


def lock_holder_pid(data_dir: Path) -> int | None:
    """The pid recorded in the lock file if a live process holds the lock, else None."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(holder) if holder.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
