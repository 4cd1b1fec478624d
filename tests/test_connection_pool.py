"""The PostgreSQL connection pool a daemon's stores share (issue 36 item 4): stores of
different containers (schemas) share its connections and still see only their own
tables; it never holds more than its size; a borrower of a full pool waits, and fails
clearly instead of hanging; a connection that comes back unusable is never lent again;
the last store to close closes its connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tierfs.cluster.container_map import with_schema
from tierfs.contracts.errors import MetadataUnavailableError
from tierfs.engine.metadata import connection_pool
from tierfs.engine.metadata.connection_pool import ConnectionPool, split_schema
from tierfs.engine.metadata.database import PostgresDatabase


def _connections(url: str, settled: int | None = None) -> int:
    """The server's count of tierfs connections to ``url``'s database; with ``settled``,
    waits (a while) for it to get there: a closed connection's backend ends a moment later."""
    deadline = time.monotonic() + 30
    while True:
        with psycopg.connect(url, autocommit=True) as admin:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                "AND application_name = 'tierfs'").fetchone()
        count = int(row[0]) if row else 0
        if settled is None or count == settled or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.fixture
def schemas(postgres_url: str) -> Iterator[list[str]]:
    """Four containers' schemas in one database, as a cluster has them."""
    names = [f"c{i:03d}" for i in range(4)]
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE SCHEMA "{name}"')
    yield names


def test_the_search_path_option_names_the_schema_and_nothing_else_is_taken_from_the_url() -> None:
    url = "postgresql://u:secret@db.example:5432/tierfs?sslmode=require"
    assert split_schema(url) == (url, None)
    base, schema = split_schema(with_schema(url, "c007"))
    assert schema == "c007"
    assert split_schema(base) == (base, None) and "sslmode=require" in base and "secret" in base


def test_stores_of_many_schemas_share_a_few_connections_and_each_sees_its_own_tables(
        postgres_url: str, schemas: list[str]) -> None:
    databases = [PostgresDatabase(with_schema(postgres_url, name)) for name in schemas * 4]  # 16 stores
    try:
        for index, db in enumerate(databases[:4]):
            db.execute("CREATE TABLE t (x INTEGER)")
            with db.transaction():
                db.execute("INSERT INTO t VALUES (?)", (index,))

        def work(db: PostgresDatabase, expected: int) -> None:
            for _ in range(20):
                with db.transaction():
                    assert db.execute("SELECT x FROM t").fetchall() == [(expected,)]
                assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)

        threads = [threading.Thread(target=work, args=(db, index % 4)) for index, db in enumerate(databases)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pool = databases[0]._pool
        assert all(db._pool is pool for db in databases)
        assert 1 <= pool.open_connections <= connection_pool.POOL_CONNECTIONS
        assert _connections(postgres_url, settled=pool.open_connections) == pool.open_connections
    finally:
        for db in databases:
            db.close()
    assert _connections(postgres_url, settled=0) == 0  # the last store closed them


def test_a_borrower_of_a_full_pool_waits_for_a_connection_then_fails_clearly(postgres_url: str) -> None:
    pool = ConnectionPool(postgres_url, size=2, wait_s=0.2)
    try:
        first, second = pool.borrow(None), pool.borrow(None)
        with pytest.raises(MetadataUnavailableError, match="all 2 connections"):
            pool.borrow(None)
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(pool.borrow(None)))
        pool._wait_s = 60.0
        waiter.start()
        time.sleep(0.05)
        assert not got  # still waiting: both are lent
        pool.give_back(first, None)
        waiter.join(timeout=60)
        assert got == [first]
        pool.give_back(second, None)
        pool.give_back(first, None)
        assert pool.open_connections == 2
    finally:
        pool.close()
    assert pool.open_connections == 0


def test_a_connection_that_comes_back_broken_or_inside_a_transaction_is_never_lent_again(
        postgres_url: str) -> None:
    pool = ConnectionPool(postgres_url, size=2)
    try:
        conn = pool.borrow(None)
        conn.execute("BEGIN")
        pool.give_back(conn, None)  # a ROLLBACK that never ran: its locks would go to the next borrower
        assert conn.closed and pool.open_connections == 0
        conn = pool.borrow(None)
        conn.close()
        pool.give_back(conn, None)
        assert pool.open_connections == 0
        again = pool.borrow(None)
        assert again is not conn and not again.closed
        assert again.execute("SELECT 1").fetchone() == (1,)
        pool.give_back(again, None)
    finally:
        pool.close()


def test_a_daemon_that_cannot_reach_the_server_says_so_and_holds_no_slot() -> None:
    pool = ConnectionPool("postgresql://tierfs@127.0.0.1:1/none?connect_timeout=1", size=1, wait_s=0.1)
    for _ in range(2):  # the failed connect gave its slot back
        with pytest.raises(MetadataUnavailableError, match="127.0.0.1"):
            pool.borrow(None)
    assert pool.open_connections == 0


def test_reads_on_the_event_loop_never_wait_behind_a_full_statements_lane(postgres_url: str) -> None:
    """Every statements connection held by a transaction (a busy daemon, or commits stuck
    behind another daemon's namespace lock): a segment row read on the event loop still
    runs at once, on the reads lane."""
    writers = [PostgresDatabase(postgres_url) for _ in range(connection_pool.POOL_CONNECTIONS)]
    reader = PostgresDatabase(postgres_url, lane=connection_pool.READS_LANE)
    busy = writers[0]._pool
    try:
        held = [busy.borrow(None) for _ in range(connection_pool.POOL_CONNECTIONS)]
        busy._wait_s = 0.1
        with pytest.raises(MetadataUnavailableError, match="stayed busy"):
            writers[0].execute("SELECT 1")
        assert reader.execute("SELECT 1").fetchone() == (1,)
        for conn in held:
            busy.give_back(conn, None)
    finally:
        for db in [*writers, reader]:
            db.close()
    assert _connections(postgres_url, settled=0) == 0
