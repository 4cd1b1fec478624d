"""Container leases and the daemon registry, in the cluster's PostgreSQL database.

Tables (schema ``public``; each container's metadata has its own schema ``cNNN``):
``cluster`` (the container count, fixed by the first daemon), ``cluster_daemons``
(every daemon's id, URL, token digest, append listener and last heartbeat) and
``cluster_containers``
(each container's owner, lease epoch and expiry).

Invariants:
- Every time is PostgreSQL's ``now()``, never a host's clock: hosts may disagree on
  the time, the database decides when a lease expired.
- A container changes owner only by ``acquire``, which raises its epoch in the same
  statement and succeeds only if the lease is free, already this daemon's, or expired
  while its owner is dead (no heartbeat for ``lease_s``): a live owner that could not
  renew (the database was down) takes its containers back when it can, with what it
  acknowledged meanwhile; so two daemons never both hold one container at one epoch,
  and an owner that renews finds out it lost the container (its epoch moved on)
  instead of extending another's.
- A lease is renewed only at the epoch its holder acquired.
- The registry keeps a digest of each daemon's token, never the token
  (``host_credentials``); a database that held tokens in the clear (before digests) has
  that column dropped when a daemon sets the tables up.
- Blocking: each call is one or two statements on this object's own connection; callers
  run them in a worker thread, one at a time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierfs.cluster.container_map import container_label
from tierfs.contracts.database_urls import redacted_url
from tierfs.contracts.errors import InvalidArgumentError, MetadataUnavailableError
from tierfs.engine.metadata.connection_pool import connect, connection_failure

_SETUP_LOCK_KEY = 0x74696572_00000002  # pg_advisory_xact_lock: one set-up at a time

_TABLES = """
CREATE TABLE IF NOT EXISTS cluster (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cluster_daemons (
    daemon_id TEXT PRIMARY KEY, url TEXT NOT NULL, heartbeat_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS cluster_containers (
    container INTEGER PRIMARY KEY, owner TEXT, epoch BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch');
ALTER TABLE cluster_daemons ADD COLUMN IF NOT EXISTS draining BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE cluster_daemons ADD COLUMN IF NOT EXISTS append_url TEXT NOT NULL DEFAULT '';
ALTER TABLE cluster_daemons ADD COLUMN IF NOT EXISTS token_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE cluster_daemons DROP COLUMN IF EXISTS token;
"""


@dataclasses.dataclass(frozen=True)
class Owner:
    """A container's current lease holder, as the registry knows it."""

    container: int
    daemon_id: str
    url: str
    epoch: int
    live: bool  # the lease has not expired
    append_url: str = ""  # its append listener (``tcp://`` or ``tls://HOST:PORT``), '' for none


class LeaseTable:
    """The cluster tables on one connection of their own (autocommit)."""

    def __init__(self, metadata_url: str, connect_timeout_s: float = 10.0) -> None:
        self.description = redacted_url(metadata_url)
        self._url = metadata_url
        self._connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._connection()  # fail now, with a clear error, if the server is not there

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._url, connect_timeout_s=self._connect_timeout_s,
                                 application_name="tierfs-leases")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """One autocommit statement; a lost connection is ``MetadataUnavailableError``
        and the next call reconnects."""
        import psycopg

        conn = self._connection()
        try:
            return conn.execute(sql, params)
        except psycopg.OperationalError as e:
            if conn.closed or conn.broken:
                conn.close()
                raise MetadataUnavailableError(self.description, connection_failure(e, self._url)) from None
            raise

    def set_up(self, containers: int) -> int:
        """Create the tables and the containers' schemas if missing; the cluster's
        container count (the first daemon's ``containers``; a different one is refused)."""
        conn = self._connection()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK_KEY,))
            if conn.execute("SELECT to_regclass('public.segments')").fetchone()[0] is not None:
                raise InvalidArgumentError(
                    f"{self.description} holds the metadata of a single store (containers = 0); "
                    "a cluster needs a database of its own")
            conn.execute(_TABLES)
            row = conn.execute("SELECT value FROM cluster WHERE key = 'containers'").fetchone()
            if row is None:
                conn.execute("INSERT INTO cluster VALUES ('containers', %s)", (str(containers),))
                count = containers
            else:
                count = int(row[0])
                if count != containers:
                    raise InvalidArgumentError(
                        f"the cluster in {self.description} has {count} containers, not {containers} "
                        "(the count is fixed when the cluster is created)")
            for container in range(count):
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{container_label(container)}"')
                conn.execute(
                    "INSERT INTO cluster_containers (container) VALUES (%s) ON CONFLICT DO NOTHING",
                    (container,))
        return count

    def heartbeat(self, daemon_id: str, url: str, token_sha256: str, append_url: str = "") -> None:
        self._execute(
            "INSERT INTO cluster_daemons (daemon_id, url, token_sha256, heartbeat_at, append_url) "
            "VALUES (%s, %s, %s, now(), %s) ON CONFLICT (daemon_id) DO UPDATE SET url = excluded.url, "
            "token_sha256 = excluded.token_sha256, heartbeat_at = now(), append_url = excluded.append_url",
            (daemon_id, url, token_sha256, append_url))

    def token_digests(self) -> dict[str, str]:
        """Every registered daemon's id -> its token's digest (``host_credentials``)."""
        rows = self._execute("SELECT daemon_id, token_sha256 FROM cluster_daemons").fetchall()
        return {daemon_id: digest for daemon_id, digest in rows if digest}

    def leave(self, daemon_id: str) -> None:
        """Unregister (a clean stop): the others rebalance without waiting for expiry."""
        self._execute("DELETE FROM cluster_daemons WHERE daemon_id = %s", (daemon_id,))

    def live_daemons(self, lease_s: float) -> dict[str, bool]:
        """Every daemon that heartbeated within a lease -> whether it is being drained."""
        rows = self._execute(
            "SELECT daemon_id, draining FROM cluster_daemons "
            "WHERE heartbeat_at > now() - make_interval(secs => %s) ORDER BY daemon_id", (lease_s,)).fetchall()
        return {daemon_id: bool(draining) for daemon_id, draining in rows}

    def set_draining(self, daemon_id: str, draining: bool) -> bool:
        """Mark a registered daemon drained (it gives its containers back and takes none)
        or not; False if no such daemon is registered. A clean stop unregisters it."""
        row = self._execute("UPDATE cluster_daemons SET draining = %s WHERE daemon_id = %s RETURNING daemon_id",
                            (draining, daemon_id)).fetchone()
        return row is not None

    def acquire(self, container: int, daemon_id: str, lease_s: float) -> int | None:
        """Take ``container`` if its lease is free, ours, or expired with its owner dead;
        the new epoch, or None."""
        row = self._execute(
            "UPDATE cluster_containers SET owner = %s, epoch = epoch + 1, "
            "expires_at = now() + make_interval(secs => %s) "
            "WHERE container = %s AND (owner IS NULL OR owner = %s OR (expires_at < now() AND NOT EXISTS ("
            "SELECT 1 FROM cluster_daemons d WHERE d.daemon_id = owner "
            "AND d.heartbeat_at > now() - make_interval(secs => %s)))) RETURNING epoch",
            (daemon_id, lease_s, container, daemon_id, lease_s)).fetchone()
        return None if row is None else int(row[0])

    def renew(self, daemon_id: str, held: dict[int, int], lease_s: float) -> set[int]:
        """Extend every lease in ``held`` (container -> epoch) still ours at that epoch;
        the containers renewed (the others were taken)."""
        if not held:
            return set()
        rows = self._execute(
            "UPDATE cluster_containers SET expires_at = now() + make_interval(secs => %s) "
            "WHERE owner = %s AND container = ANY(%s) RETURNING container, epoch",
            (lease_s, daemon_id, list(held))).fetchall()
        return {int(c) for c, epoch in rows if held.get(int(c)) == int(epoch)}

    def release(self, container: int, daemon_id: str, epoch: int) -> None:
        self._execute(
            "UPDATE cluster_containers SET owner = NULL, expires_at = 'epoch' "
            "WHERE container = %s AND owner = %s AND epoch = %s", (container, daemon_id, epoch))

    def owners(self) -> dict[int, Owner]:
        """Every container with an owner that is registered (expired leases included)."""
        rows = self._execute(
            "SELECT c.container, c.owner, d.url, c.epoch, c.expires_at > now(), d.append_url "
            "FROM cluster_containers c JOIN cluster_daemons d ON d.daemon_id = c.owner").fetchall()
        return {int(c): Owner(int(c), owner, url, int(epoch), bool(live), append_url)
                for c, owner, url, epoch, live, append_url in rows}

    def has_cluster(self) -> bool:
        """A cluster daemon has set this database up (``set_up``)."""
        return self._execute("SELECT to_regclass('public.cluster_containers')").fetchone()[0] is not None

    def daemons(self) -> list[tuple[str, str, float, bool]]:
        """Every registered daemon: id, URL, seconds since its heartbeat (the database's
        clock), whether it is being drained."""
        rows = self._execute("SELECT daemon_id, url, EXTRACT(EPOCH FROM now() - heartbeat_at), draining "
                             "FROM cluster_daemons ORDER BY daemon_id").fetchall()
        return [(daemon_id, url, float(age), bool(draining)) for daemon_id, url, age, draining in rows]

    def leases(self) -> list[tuple[int, str | None, int, float]]:
        """Every container: number, owner (None: free), epoch, seconds its lease has left
        (negative once expired; the database's clock)."""
        rows = self._execute("SELECT container, owner, epoch, EXTRACT(EPOCH FROM expires_at - now()) "
                             "FROM cluster_containers ORDER BY container").fetchall()
        return [(int(c), owner, int(epoch), float(left)) for c, owner, epoch, left in rows]

    def epochs(self) -> dict[int, int]:
        """Every container's lease epoch (raised at each acquisition)."""
        rows = self._execute("SELECT container, epoch FROM cluster_containers").fetchall()
        return {int(c): int(epoch) for c, epoch in rows}

    def expired(self, lease_s: float) -> list[int]:
        """Containers whose owner died (its lease expired and it stopped heartbeating):
        nobody serves them. A live owner's expired lease is its own to renew."""
        rows = self._execute(
            f"SELECT container FROM cluster_containers WHERE owner IS NOT NULL AND {_DEAD_OWNER} "
            "ORDER BY container", (lease_s,)).fetchall()
        return [int(c) for (c,) in rows]

    def any_free_or_expired(self) -> bool:
        """Whether some container has no owner or an expired lease now (one cheap read)."""
        return bool(self._execute("SELECT EXISTS (SELECT 1 FROM cluster_containers "
                                  "WHERE owner IS NULL OR expires_at < now())").fetchone()[0])

    def free(self, lease_s: float) -> list[int]:
        """Containers nobody holds (``lease_s``: as ``free_or_expired``'s, unused)."""
        del lease_s
        rows = self._execute("SELECT container FROM cluster_containers WHERE owner IS NULL "
                             "ORDER BY container").fetchall()
        return [int(c) for (c,) in rows]

    def free_or_expired(self, lease_s: float) -> list[int]:
        rows = self._execute(
            f"SELECT container FROM cluster_containers WHERE owner IS NULL OR {_DEAD_OWNER} "
            "ORDER BY container", (lease_s,)).fetchall()
        return [int(c) for (c,) in rows]


# a container's lease expired and its owner has not heartbeated for a lease (one parameter)
_DEAD_OWNER = ("(expires_at < now() AND NOT EXISTS (SELECT 1 FROM cluster_daemons d WHERE d.daemon_id = owner "
               "AND d.heartbeat_at > now() - make_interval(secs => %s)))")
