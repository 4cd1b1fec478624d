"""The SQLite side of the metadata store: the schema, the row type of a segment and
the one transaction helper.

Invariants:
- Every multi-row change runs inside one ``Transaction`` (BEGIN IMMEDIATE ... COMMIT),
  rolled back on any exception, so a failed change leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

from tierfs.contracts.errors import NoSpaceError
from tierfs.engine.record_types import SegmentMeta
from tierfs.engine.space_reserve import SpaceReserve

SCHEMA = """
CREATE TABLE IF NOT EXISTS store (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS directories (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    rev INTEGER NOT NULL,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    segment_id INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (segment_id, start_offset)
);
CREATE TABLE IF NOT EXISTS garbage (name TEXT PRIMARY KEY, queued_ns INTEGER NOT NULL);
"""


@dataclasses.dataclass
class SegmentRow:
    segment_id: int
    name: str
    rev: int
    record: SegmentMeta


def now_ns() -> int:
    return time.time_ns()


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception. A full disk (SQLite
    says SQLITE_FULL, at any statement or at COMMIT) rolls back, releases the data dir's
    space reserve so that the caller's retry finds room, and raises ``NoSpaceError``."""

    def __init__(self, db: sqlite3.Connection, path: Path, reserve: SpaceReserve | None) -> None:
        self._db = db
        self._path = path
        self._reserve = reserve

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                if self._reserve is not None:
                    self._reserve.ensure()  # a stat while it exists
                return
            except sqlite3.Error as e:
                exc = e
        if self._db.in_transaction:  # SQLite may have rolled back by itself
            self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error) and exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
            if self._reserve is not None:
                self._reserve.release()  # so that the caller's retry finds room
            raise NoSpaceError(str(self._path.parent), 4096) from exc
        if exc_type is None and isinstance(exc, BaseException):
            raise exc
