"""The metadata's database connection: SQLite (embedded, the default) or PostgreSQL
(psycopg 3, shared by many daemons), behind one small interface so the metadata has
one code path and one set of SQL statements for both.

Invariants:
- Statements are written once, with ``?`` placeholders and SQL both engines accept
  (``INSERT ... ON CONFLICT``, ``RETURNING``); only the DDL differs per dialect
  (``metadata.migrations``). The PostgreSQL connection rewrites placeholders, nothing else.
- Every multi-row change runs inside ``transaction()``: BEGIN ... COMMIT, rolled back on
  any exception, so a failed change leaves nothing behind. ``transaction(namespace=True)``
  also serializes it against every other namespace change of every daemon on the same
  database (SQLite: BEGIN IMMEDIATE; PostgreSQL: a transaction-scoped advisory lock), so
  the checks a create or rename makes ("is this name free?") still hold at its commit.
- Conditional updates (``... WHERE rev=?``) are safe under PostgreSQL's READ COMMITTED:
  an UPDATE re-checks its WHERE against the newest committed row and waits for a
  concurrent writer of that row, so two writers with the same revision never both win.
- A full disk (SQLite) rolls back and raises ``NoSpaceError`` after releasing the data
  dir's space reserve, so the caller's retry finds room. A PostgreSQL server that cannot
  be reached, or a connection lost mid-way, raises ``MetadataUnavailableError`` (nothing
  is known to have changed unless the loss hit a COMMIT in flight); the next call
  reconnects. A connection that died while idle (the server restarted) is found by the
  next statement: a ``BEGIN`` or a read outside a transaction changed nothing, so it runs
  once more on a new connection; any other statement is never sent twice.
- PostgreSQL statements run on connections of the process's pool, shared by every store
  of a daemon (``connection_pool``): a transaction holds one connection throughout, a
  statement outside one borrows a connection for itself alone.
- The password of a PostgreSQL URL never appears in an error message or a log line
  (``redacted_url``).
- Not thread-safe: one caller at a time per ``Database`` object (the store's metadata
  worker); many objects may share one pool.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from tierfs.contracts.database_urls import is_postgresql_url, redacted_url
from tierfs.contracts.errors import (
    ConcurrentModificationError,
    MetadataUnavailableError,
    NoSpaceError,
)
from tierfs.engine.metadata import connection_pool
from tierfs.engine.metadata.connection_pool import DEAD_PEER_DETECTION, connection_failure
from tierfs.engine.space_reserve import SpaceReserve

__all__ = ["DEAD_PEER_DETECTION", "Database", "IntegrityViolation", "PostgresDatabase", "SqliteDatabase", "is_postgresql_url",
           "open_database", "redacted_url"]

SQLITE = "sqlite"
POSTGRESQL = "postgresql"

# pg_advisory_xact_lock key of namespace changes: any constant, the same for every daemon
_NAMESPACE_LOCK_KEY = 0x7469_6572_6673  # "tierfs"


class IntegrityViolation(Exception):
    """A statement broke a uniqueness or key constraint (either engine); the
    transaction it ran in is rolled back."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Database(Protocol):
    """What the metadata needs of a connection."""

    dialect: str  # SQLITE or POSTGRESQL
    description: str  # where it is, without secrets (for messages)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor: ...
    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None: ...
    def transaction(
        self, namespace: bool = False, synced: bool = True
    ) -> contextlib.AbstractContextManager[None]: ...
    def close(self) -> None: ...

    @property
    def checkpoint_due(self) -> bool:
        """Whether the next commit should be a synced one, which checkpoints (SQLite)."""
        ...

    # Run first in every transaction once set (``ownership.epoch_guard.guard_epoch``): raises to
    # refuse the transaction before any statement of it changed anything.
    epoch_guard: Callable[[], None] | None


# SQLite checkpoints inside the COMMIT that leaves more than 1,000 pages (4 MiB) in the
# WAL. An unsynced commit, made on the event loop, must never be that one (it would copy
# pages and fsync twice there): it runs with the automatic checkpoint off, and after this
# many of them in a row the next commit should be a synced one (``checkpoint_due``), so
# the WAL of a store that only creates files stays about that size (4-6 pages a create).
UNSYNCED_COMMITS_BEFORE_CHECKPOINT = 256
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default


class SqliteDatabase:
    """SQLite in WAL mode with synchronous=FULL: a commit is on disk when it returns,
    unless the transaction was opened with ``synced=False`` (then it is on disk with
    the next synced commit or checkpoint: the WAL is a prefix log)."""

    dialect = SQLITE

    def __init__(self, path: Path, reserve: SpaceReserve | None = None) -> None:
        self.path = path
        self.description = str(path)
        self.reserve = reserve
        self.epoch_guard: Callable[[], None] | None = None
        self._unsynced_commits = 0  # in a row, since the last synced commit
        try:
            self._db = self._connect()
        except sqlite3.OperationalError:  # e.g. no room for the WAL index (-shm) file
            if reserve is None or not reserve.release():
                raise
            self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error:
            db.close()
            raise
        return db

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.IntegrityError as e:
            raise IntegrityViolation(str(e)) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        try:
            self._db.executemany(sql, rows)
        except sqlite3.IntegrityError as e:
            raise IntegrityViolation(str(e)) from e

    def executescript(self, script: str) -> None:
        self._db.executescript(script)

    @property
    def checkpoint_due(self) -> bool:
        """Unsynced commits never checkpoint: after ``UNSYNCED_COMMITS_BEFORE_CHECKPOINT``
        of them in a row the next commit should be synced (it checkpoints), or the WAL
        of a store that only creates files would grow without bound."""
        return self._unsynced_commits >= UNSYNCED_COMMITS_BEFORE_CHECKPOINT

    @contextlib.contextmanager
    def transaction(self, namespace: bool = False, synced: bool = True) -> Iterator[None]:
        """BEGIN IMMEDIATE takes SQLite's one write lock, so every transaction is
        serialized whatever ``namespace`` says. ``synced=False``: COMMIT writes the WAL
        without an fsync and never checkpoints (nothing here waits for the disk, so the
        event loop may run it); the commit is durable once a later synced commit or
        checkpoint returns (the WAL keeps a prefix of the commits)."""
        if not synced:
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA wal_autocheckpoint=0")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self.epoch_guard is not None:
                    self.epoch_guard()
                yield
                self._db.execute("COMMIT")
            except BaseException as e:
                if self._db.in_transaction:  # SQLite may have rolled back by itself
                    self._db.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error) and e.sqlite_errorcode == sqlite3.SQLITE_FULL:
                    if self.reserve is not None:
                        self.reserve.release()  # so that the caller's retry finds room
                    raise NoSpaceError(str(self.path.parent), 4096) from e
                raise
        finally:
            if not synced:
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        if not synced:
            self._unsynced_commits += 1
            return
        self._unsynced_commits = 0
        if self.reserve is not None:
            self.reserve.ensure()  # a stat while it exists

    def close(self) -> None:
        self._db.close()


# statements that change nothing when they run outside a transaction: safe to send again
_CHANGES_NOTHING = re.compile(r"\s*(BEGIN|SELECT)\b", re.IGNORECASE)


class PostgresDatabase:
    """Statements on connections of the process's pool (``connection_pool``), in
    autocommit mode; ``transaction()`` holds one connection from BEGIN to COMMIT. READ
    COMMITTED, with the namespace lock where names are checked."""

    dialect = POSTGRESQL

    def __init__(self, url: str, connect_timeout_s: float = 10.0,
                 lane: str = connection_pool.STATEMENTS_LANE) -> None:
        self.url = url
        self.description = redacted_url(url)
        self._pool, self._schema = connection_pool.join(url, connect_timeout_s, lane)
        self._transaction: Any = None  # the connection of the open transaction
        self._closed = False
        self.epoch_guard: Callable[[], None] | None = None
        try:  # fail now, with a clear error, if the server is not there
            self._pool.give_back(self._pool.borrow(self._schema), self._schema)
        except BaseException:
            self.close()
            raise

    def _unavailable(self, e: Exception) -> MetadataUnavailableError:
        return MetadataUnavailableError(self.description, connection_failure(e, self.url))

    def _run(self, sql: str, params: Sequence[object], many: bool) -> Any:
        try:
            return self._run_once(sql, params, many)
        except MetadataUnavailableError:
            if self._transaction is not None or many or not _CHANGES_NOTHING.match(sql):
                raise
            return self._run_once(sql, params, many)  # on a new connection (see the module docstring)

    def _run_once(self, sql: str, params: Sequence[object], many: bool, conn: Any = None) -> Any:
        import psycopg

        if conn is None:
            conn = self._transaction
        lent = conn is None
        if lent:
            conn = self._pool.borrow(self._schema)
        statement = sql.replace("%", "%%").replace("?", "%s")
        try:
            cursor = conn.cursor()
            if many:
                cursor.executemany(statement, params)
            else:
                cursor.execute(statement, params)
            return cursor
        except psycopg.IntegrityError as e:
            raise IntegrityViolation(str(e)) from e
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as e:
            # PostgreSQL aborted this transaction against a concurrent one: nothing of
            # it stays, exactly like a conditional update that found a newer revision
            raise ConcurrentModificationError(f"metadata transaction aborted: {e}") from e
        except psycopg.OperationalError as e:
            if conn.closed or conn.broken:
                raise self._unavailable(e) from None
            raise
        finally:
            if lent:
                self._pool.give_back(conn, self._schema)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        return self._run(sql, params, many=False)  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        self._run(sql, list(rows), many=True)

    checkpoint_due = False  # PostgreSQL checkpoints by itself

    def _begin(self) -> Any:
        """A connection of the pool with a transaction open on it: a BEGIN that found its
        connection dead (it changed nothing) is sent once more on a new one."""
        for attempt in (1, 2):
            conn = self._pool.borrow(self._schema)
            try:
                self._run_once("BEGIN", (), many=False, conn=conn)
                return conn
            except MetadataUnavailableError:
                self._pool.give_back(conn, self._schema)  # closed: the pool opens another
                if attempt == 2:
                    raise
            except BaseException:
                self._pool.give_back(conn, self._schema)
                raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def transaction(self, namespace: bool = False, synced: bool = True) -> Iterator[None]:
        """``synced`` is SQLite's concern: every PostgreSQL commit is durable."""
        if self._transaction is not None:
            raise RuntimeError("nested metadata transaction")
        conn = self._transaction = self._begin()
        try:
            if namespace:
                self.execute("SELECT pg_advisory_xact_lock(?)", (_NAMESPACE_LOCK_KEY,))
            if self.epoch_guard is not None:
                self.epoch_guard()
            yield
            self.execute("COMMIT")
        except BaseException:
            if not conn.closed:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
            raise
        finally:
            self._transaction = None
            self._pool.give_back(conn, self._schema)  # closed if it is still in a transaction

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            connection_pool.leave(self._pool)


def open_database(url: str, sqlite_path: Path, reserve: SpaceReserve | None = None, *,
                  event_loop_reads: bool = False) -> Database:
    """``postgresql://...`` (or ``postgres://``) opens PostgreSQL; anything else is the
    data dir's SQLite file ``sqlite_path`` (``sqlite:``, the default). ``event_loop_reads``:
    for reads made on the event loop, on PostgreSQL the pool's reads lane."""
    if is_postgresql_url(url):
        return PostgresDatabase(url, lane=connection_pool.READS_LANE if event_loop_reads
                                else connection_pool.STATEMENTS_LANE)
    return SqliteDatabase(sqlite_path, reserve)


def escape_like(text: str) -> str:
    """``text`` with every character literal in ``LIKE ? ESCAPE '\\'`` (the same on SQLite
    and PostgreSQL), so a prefix match never matches a name by accident."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
