"""The data dir's lost+found as front ends see it (``tierfs lost-found``, ``/metrics``):
its entries and, for a restore, the appends each one holds (``engine/lost_found``,
``engine/lost_found_records``). Blocking: callers run it in a worker thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tierfs.engine.recovery.lost_found import LostFoundEntry, entries
from tierfs.engine.recovery.lost_found_records import Piece, pieces

__all__ = ["LostFoundEntry", "Piece", "held", "held_bytes", "restorable"]


def held(data_dir: Path) -> list[LostFoundEntry]:
    """Every entry of ``<data_dir>/lost+found``."""
    return entries(data_dir)


def held_bytes(data_dir: Path) -> tuple[int, int]:
    """(entries, bytes) held in ``<data_dir>/lost+found``."""
    found = entries(data_dir)
    return len(found), sum(e.size for e in found)


def restorable(data_dir: Path, entry: LostFoundEntry) -> Iterator[Piece]:
    """The appends ``entry`` holds, in order."""
    return pieces(data_dir, entry)
