"""The suite's PostgreSQL: a real server run as an unprivileged user, reachable over TCP
and its Unix socket, one isolated database per test, and nothing left after stop."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from tierfs.testing.postgres import SERVER_USER, PostgresServer


def _postgres_pids(directory: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(directory) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_databases_are_isolated_and_reached_over_tcp_and_the_socket(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.create_database(), postgres_server.create_database()
    with psycopg.connect(first, autocommit=True) as a:
        a.execute("CREATE TABLE only_here (x int)")
        if os.geteuid() == 0:  # PostgreSQL refuses root: the server runs as its own user
            assert a.execute("SELECT usename FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
            owner = a.execute("SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_database "
                              "WHERE datname = current_database()").fetchone()
            assert owner == ("tierfs",)
    with psycopg.connect(second, autocommit=True) as b:
        assert b.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
    socket_url = f"postgresql://tierfs@/postgres?host={postgres_server.socket_directory}&port={postgres_server.port}"
    with psycopg.connect(socket_url) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_kill_drops_connections_start_brings_the_data_back_and_stop_leaves_nothing() -> None:
    server = PostgresServer().start()
    directory = server.directory
    assert directory is not None
    if os.geteuid() == 0:
        assert directory.stat().st_uid != 0  # owned by the unprivileged server user
        import pwd
        assert pwd.getpwuid(directory.stat().st_uid).pw_name == SERVER_USER
    url = server.create_database("kept")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
        server.kill()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    server.start()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    server.stop()
    assert not directory.exists()
    assert _postgres_pids(directory) == []
