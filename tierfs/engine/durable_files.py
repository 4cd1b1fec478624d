"""Making a file's name durable: after creating, renaming or linking a file, its
directory is fsynced, or a crash can forget the name while keeping the bytes.

Invariant: ``fsync_directory`` is the one place the engine does this.
"""

from __future__ import annotations

import os


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
