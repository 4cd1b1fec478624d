"""PostgreSQL connections shared by every store of one process: a daemon holding many
containers uses at most ``POOL_CONNECTIONS`` connections for all their metadata
statements and one for their reads on the event loop, instead of two per container, so a cluster of 64 containers on 3 daemons fits a stock server's
``max_connections`` (100).

Invariants:
- One pool per server, database and user (the URL without a ``search_path`` option)
  and lane: the stores of every container of a daemon share it, and each still sees only
  its own schema, because a lent connection's ``search_path`` is the borrower's (one
  ``set_config``, only when it differs) before any statement of the borrower runs.
- A connection is lent to one borrower at a time, for one autocommit statement (a
  psycopg cursor holds its whole result, so it is read after the connection went back)
  or for a whole transaction (back after COMMIT or ROLLBACK). A connection that comes
  back closed, broken or still inside a transaction is closed, never lent again.
- Bounded: at most ``size`` connections exist at once; a borrower waits for one at most
  ``wait_s`` and then gets ``MetadataUnavailableError``, never a hang (a transaction
  that needed a second connection of a full pool would otherwise wait forever).
- Reads made on the event loop (segment rows loaded on demand: ``READS_LANE``) have a
  lane of their own, so the event loop never waits behind the stores' transactions
  holding every connection of the statements lane (it would stall every request and the
  lease renewals with it).
- The pool closes its connections when its last user leaves (``leave``), so a process
  that opens and closes stores keeps no connection to a server it is done with.
- Thread-safe: the metadata workers of many stores borrow at the same time.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

from tierfs.contracts.database_urls import redacted_url
from tierfs.contracts.errors import MetadataUnavailableError

# Connections of the statements lane: enough for the metadata workers of a daemon's
# containers to commit side by side (each holds one for a transaction of a few
# statements), few enough that 3 daemons with their reads lane, lease and growth-channel
# connections (10 each) stay far under a stock server's 100.
POOL_CONNECTIONS = 7
STATEMENTS_LANE = "statements"
READS_LANE = "reads"  # one connection: reads made on the event loop, which are one at a time
LANE_CONNECTIONS = {STATEMENTS_LANE: POOL_CONNECTIONS, READS_LANE: 1}
# A cluster daemon's connections at most: both lanes, its leases' and its LISTEN.
DAEMON_CONNECTIONS = sum(LANE_CONNECTIONS.values()) + 2
# How long a borrower waits for a connection of a full pool before its call fails.
POOL_WAIT_S = 30.0

# libpq's dead-peer detection for every PostgreSQL connection: a server or network that
# vanishes without closing the connection (a partition, a host lost) fails the call in
# about 15 s instead of the kernel's two hours, so no lease renewal or commit waits forever.
DEAD_PEER_DETECTION: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                                       "keepalives_count": 3, "tcp_user_timeout": 15_000}

_SEARCH_PATH_OPTION = "-csearch_path="


def split_schema(url: str) -> tuple[str, str | None]:
    """(the URL without a ``search_path`` option, that schema or None)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value[len(_SEARCH_PATH_OPTION):] for key, value in query
               if key == "options" and value.startswith(_SEARCH_PATH_OPTION) and " " not in value]
    if not schemas:
        return url, None
    rest = [(key, value) for key, value in query if not (key == "options" and value.startswith(_SEARCH_PATH_OPTION))]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(rest))), schemas[-1]


def connect(url: str, *, connect_timeout_s: float = 10.0, autocommit: bool = True,
            application_name: str = "tierfs", snapshot: bool = False) -> Any:
    """One connection to the database at ``url`` with the pool's connect timeout and
    dead-peer detection; ``MetadataUnavailableError`` (the URL redacted) if it cannot
    be made, never a hang or a driver error. ``snapshot``: its transactions are
    read-only and REPEATABLE READ (one committed state, whatever commits meanwhile)."""
    import psycopg  # only a PostgreSQL store loads the driver

    try:
        conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=max(1, int(connect_timeout_s)),
                               application_name=application_name, **DEAD_PEER_DETECTION)
    except psycopg.Error as e:
        raise MetadataUnavailableError(redacted_url(url), connection_failure(e, url)) from None
    if snapshot:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
    return conn


def connection_failure(e: Exception, url: str) -> str:
    """The first line of a driver error, with the URL's password redacted."""
    reason = str(e).replace(url, redacted_url(url)).strip().splitlines()
    return reason[0] if reason else type(e).__name__


class ConnectionPool:
    """Autocommit connections to one database, lent with a schema (see the module docstring)."""

    def __init__(self, url: str, size: int = POOL_CONNECTIONS, connect_timeout_s: float = 10.0,
                 wait_s: float = POOL_WAIT_S, lane: str = STATEMENTS_LANE) -> None:
        self.url = url
        self.description = redacted_url(url)
        self.size = size
        self._connect_timeout_s = connect_timeout_s
        self._wait_s = wait_s
        self._idle: list[tuple[Any, str | None]] = []  # (connection, its search_path), newest last
        self._open = 0
        self._users = 0
        self.lane = lane
        self._closed = False
        self._changed = threading.Condition()

    @property
    def open_connections(self) -> int:
        return self._open

    def borrow(self, schema: str | None) -> Any:
        """A connection whose ``search_path`` is ``schema`` (None: the server's default),
        for this caller alone until ``give_back``."""
        taken = self._take(schema)
        conn = None if taken is None else taken[0]
        try:
            if taken is None:
                conn, current = self._connect(), None
            else:
                current = taken[1]
            if current != schema:
                self._set_schema(conn, schema)
            return conn
        except BaseException:
            if conn is not None:
                conn.close()
            self._forget_one()
            raise

    def give_back(self, conn: Any, schema: str | None) -> None:
        """Return ``conn`` (lent with ``schema``); a closed or broken one, or one still in a
        transaction, is closed instead of lent again."""
        from psycopg.pq import TransactionStatus

        reusable = not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
        with self._changed:
            if reusable and not self._closed:
                self._idle.append((conn, schema))
                self._changed.notify()
                return
        conn.close()
        self._forget_one()

    def close(self) -> None:
        """Close the idle connections now and every lent one when it comes back."""
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._changed.notify_all()
        for conn, _ in idle:
            conn.close()

    def _take(self, schema: str | None) -> tuple[Any, str | None] | None:
        """An idle connection and its schema (one already on ``schema`` if any is), or
        None when the caller may open a new one; waits while the pool is full."""
        deadline = time.monotonic() + self._wait_s
        with self._changed:
            while True:
                if self._idle:
                    on_schema = [i for i, (_, current) in enumerate(self._idle) if current == schema]
                    return self._idle.pop(on_schema[-1] if on_schema else -1)
                if self._open < self.size:
                    self._open += 1
                    return None
                left_s = deadline - time.monotonic()
                if left_s <= 0 or self._closed:
                    raise MetadataUnavailableError(
                        self.description, f"all {self.size} connections of this daemon's pool stayed busy "
                                          f"for {self._wait_s:g} s")
                self._changed.wait(left_s)

    def _forget_one(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify()

    def _connect(self) -> Any:
        return connect(self.url, connect_timeout_s=self._connect_timeout_s)

    def _set_schema(self, conn: Any, schema: str | None) -> None:
        import psycopg

        try:
            if schema is None:
                conn.execute("RESET search_path")
            else:
                conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        except psycopg.OperationalError as e:
            raise MetadataUnavailableError(self.description, connection_failure(e, self.url)) from None


_pools: dict[tuple[str, str], ConnectionPool] = {}
_pools_lock = threading.Lock()


def join(url: str, connect_timeout_s: float = 10.0, lane: str = STATEMENTS_LANE) -> tuple[ConnectionPool, str | None]:
    """The process's pool of ``lane`` for ``url``'s database (made on first use) and
    ``url``'s schema; every ``join`` is matched by one ``leave``."""
    base, schema = split_schema(url)
    with _pools_lock:
        pool = _pools.get((base, lane))
        if pool is None:
            pool = _pools[base, lane] = ConnectionPool(base, LANE_CONNECTIONS[lane], connect_timeout_s, lane=lane)
        pool._users += 1
    return pool, schema


def leave(pool: ConnectionPool) -> None:
    """One user of ``pool`` is done; the last one closes it."""
    with _pools_lock:
        pool._users -= 1
        if pool._users > 0:
            return
        if _pools.get((pool.url, pool.lane)) is pool:
            del _pools[pool.url, pool.lane]
    pool.close()
