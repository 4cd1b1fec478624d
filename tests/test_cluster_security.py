"""Security between the hosts of a cluster (issue 36 item 6): the registry keeps token
digests, never tokens; a daemon takes requests from registered hosts only, each with
its own credentials; hosts talk TLS to each other and to clients, every certificate
checked; PostgreSQL is reached over verified TLS through its URL."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tierfs.contracts.errors import DaemonUnavailableError
from tierfs.remote.client import TierClient
from tierfs.testing.cluster import Cluster, make_certificates
from tierfs.testing.harness import HarnessError
from tierfs.testing.postgres import PostgresServer

pytestmark = pytest.mark.usefixtures("postgres_server")  # skipped where PostgreSQL is not installed
REFUSED_WITHIN_S = 30.0  # a host that left is refused within the registry cache (2 s); loaded machines are slow


@pytest.fixture
def two_hosts(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path / "cluster", postgres_url, str(tmp_path / "tier2"), containers=4)
    try:
        cluster.start_together([0, 1])
        cluster.wait_balanced([0, 1])
        yield cluster
    finally:
        cluster.stop_all()


def _token(cluster: Cluster, index: int) -> str:
    return (cluster.data_dir(index) / "token").read_text().strip()


def _append_listener_post(append_url: str, header_lines: str, container: int, name: str) -> bytes:
    """One raw forwarded append of ``b"raw\\n"`` to the append listener: its answer."""
    parts = urllib.parse.urlsplit(append_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as conn:
        conn.sendall(f"POST /v1/segments/{urllib.parse.quote(name, safe='')} HTTP/1.1\r\nhost: t\r\n{header_lines}"
                     f"x-tierfs-forwarded: {container}\r\ncontent-length: 4\r\n\r\nraw\n".encode())
        answer = b""
        while not (b"\r\n\r\n" in answer and answer.rstrip().endswith(b"}")):
            piece = conn.recv(65536)
            if not piece:
                break
            answer += piece
    return answer


def test_the_registry_keeps_digests_and_takes_only_registered_hosts(two_hosts: Cluster) -> None:
    cluster = two_hosts
    tokens = {index: _token(cluster, index) for index in (0, 1)}
    ids = {index: cluster.daemon_id(index) for index in (0, 1)}
    with psycopg.connect(cluster.metadata_url) as conn:
        cursor = conn.execute("SELECT * FROM cluster_daemons")
        columns = [column.name for column in cursor.description or ()]
        rows = repr(cursor.fetchall())
        digests = dict(conn.execute("SELECT daemon_id, token_sha256 FROM cluster_daemons").fetchall())
        listeners = dict(conn.execute("SELECT daemon_id, append_url FROM cluster_daemons").fetchall())
    assert "token" not in columns
    assert all(token not in rows for token in tokens.values())
    assert digests == {ids[i]: hashlib.sha256(tokens[i].encode()).hexdigest() for i in (0, 1)}

    api = f"http://127.0.0.1:{cluster.ports[0]}/v1/health"

    def api_status(headers: dict[str, str]) -> int:
        return httpx.get(api, headers=headers, timeout=30).status_code

    peer = {"Authorization": f"Bearer {tokens[1]}", "X-Tierfs-Host": ids[1]}
    assert api_status({"Authorization": f"Bearer {tokens[0]}"}) == 200  # its own clients
    assert api_status(peer) == 200  # a registered host, with its own token
    assert api_status({"Authorization": f"Bearer {tokens[1]}"}) == 401  # a host's token, unnamed
    assert api_status({"Authorization": f"Bearer {tokens[0]}", "X-Tierfs-Host": ids[1]}) == 401  # not its token
    assert api_status({"Authorization": f"Bearer {tokens[1]}", "X-Tierfs-Host": "stranger"}) == 401

    # the append listener judges the same way; refused appends change nothing
    container = cluster.held_by(0)[0]
    top = next(f"d{n}" for n in range(400) if _container_of(f"d{n}", cluster) == container)
    name = f"{top}/log"
    client = cluster.client(1)
    try:
        client.create(name, parents=True)
        for lines in (f"authorization: Bearer {tokens[1]}\r\nx-tierfs-host: stranger\r\n",
                      f"authorization: Bearer {tokens[0]}\r\nx-tierfs-host: {ids[1]}\r\n",
                      f"authorization: Bearer {tokens[1]}\r\n"):
            assert _append_listener_post(listeners[ids[0]], lines, container, name).startswith(b"HTTP/1.1 401 ")
        assert client.read(name) == b""
        landed = _append_listener_post(listeners[ids[0]], f"authorization: Bearer {tokens[1]}\r\nx-tierfs-host: "
                                       f"{ids[1]}\r\n", container, name)
        assert landed.startswith(b"HTTP/1.1 200 "), landed
        client.append(name, b"forwarded\n")  # host 1 forwards it with its own credentials
        assert client.read(name) == b"raw\nforwarded\n"
    finally:
        client.close()

    # a host that left (a clean stop unregisters it) is refused
    cluster.daemons[1].stop()
    deadline = time.monotonic() + REFUSED_WITHIN_S
    while api_status(peer) != 401:
        assert time.monotonic() < deadline, "a host that left was still taken"
        time.sleep(0.2)


def _container_of(name: str, cluster: Cluster) -> int:
    from tierfs.cluster.container_map import container_of

    return container_of(name, cluster.containers)


def test_hosts_and_clients_talk_tls_with_every_certificate_checked(tmp_path: Path, postgres_url: str) -> None:
    certificates = make_certificates(tmp_path / "tls")
    cluster = Cluster(tmp_path / "cluster", postgres_url, str(tmp_path / "tier2"), containers=4, tls=certificates)
    try:
        cluster.start_together([0, 1])
        cluster.wait_balanced([0, 1])
        with psycopg.connect(cluster.metadata_url) as conn:
            urls = conn.execute("SELECT url, append_url FROM cluster_daemons").fetchall()
        assert all(url.startswith("https://") and append.startswith("tls://") for url, append in urls), urls

        # every host writes into every container: the others' appends and calls go over TLS
        expected = cluster.write_in_every_container([0, 1])
        for index in (0, 1):
            client = cluster.client(index)
            try:
                assert {name: client.read(name) for name in expected} == expected
            finally:
                client.close()

        url, token = f"https://127.0.0.1:{cluster.ports[0]}", _token(cluster, 0)
        first = next(iter(expected))
        trusted, untrusted = TierClient(url, token, ca_path=str(certificates.ca)), TierClient(url, token)
        try:
            assert trusted.read(first) == expected[first]
            with pytest.raises(DaemonUnavailableError, match="certificate"):
                untrusted.health()
        finally:
            trusted.close()
            untrusted.close()
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{cluster.ports[0]}/v1/health", timeout=30,
                      headers={"Authorization": f"Bearer {token}"})

        listener = next(append for _, append in urls)
        plain = _append_listener_post(listener.replace("tls://", "tcp://"), f"authorization: Bearer {token}\r\n",
                                      0, "d0/log")
        assert not plain.startswith(b"HTTP/1.1 2"), plain  # no append over plain text

        # the CLI: --tls-ca (or TIERFS_CA) with TIERFS_TOKEN
        listed = subprocess.run([sys.executable, "-m", "tierfs.cli", "--url", url, "--tls-ca", str(certificates.ca),
                                 "cat", first], capture_output=True, timeout=120,
                                env={"TIERFS_TOKEN": token, "PATH": "/usr/bin:/bin"})
        assert listed.returncode == 0 and listed.stdout == expected[first], listed.stderr
        by_env = subprocess.run([sys.executable, "-m", "tierfs.cli", "--url", url, "cat", first], capture_output=True,
                                timeout=120, env={"TIERFS_TOKEN": token, "TIERFS_CA": str(certificates.ca),
                                                  "PATH": "/usr/bin:/bin"})
        assert by_env.returncode == 0 and by_env.stdout == expected[first], by_env.stderr
        without = subprocess.run([sys.executable, "-m", "tierfs.cli", "--url", url, "cat", first], capture_output=True,
                                 timeout=120, env={"TIERFS_TOKEN": token, "PATH": "/usr/bin:/bin"})
        assert without.returncode != 0 and b"certificate verify failed" in without.stderr, without.stderr
    finally:
        cluster.stop_all()


def test_a_cluster_url_that_does_not_match_the_daemons_tls_is_refused(tmp_path: Path, postgres_url: str) -> None:
    certificates = make_certificates(tmp_path / "tls")
    cluster = Cluster(tmp_path / "cluster", postgres_url, str(tmp_path / "tier2"), containers=2, tls=certificates,
                      extra=['cluster_url = "http://127.0.0.1:1"'])
    try:
        with pytest.raises(HarnessError, match="must be https:// since this daemon serves TLS"):
            cluster.start(0)
    finally:
        cluster.stop_all()


def test_postgresql_is_reached_over_verified_tls(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path / "tls")
    with PostgresServer(tls=(certificates.cert, certificates.key)) as server:
        url = server.create_database()
        verified = f"{url}?sslmode=verify-full&sslrootcert={certificates.ca}"
        cluster = Cluster(tmp_path / "cluster", verified, str(tmp_path / "tier2"), containers=2)
        try:
            cluster.start(0)
            cluster.wait_balanced([0])
            client = cluster.client(0)
            try:
                client.create("over/tls", parents=True)
                client.append("over/tls", b"sealed in transit\n")
                assert client.read("over/tls") == b"sealed in transit\n"
            finally:
                client.close()
            with psycopg.connect(url) as conn:
                encrypted = conn.execute(
                    "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a "
                    "USING (pid) WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()").fetchone()
            assert encrypted is not None and encrypted[0] == encrypted[1] > 0, encrypted

            wrong = make_certificates(tmp_path / "other-ca")
            refused = subprocess.run(
                [sys.executable, "-m", "tierfs.cli", "--metadata", f"{url}?sslmode=verify-full&sslrootcert={wrong.ca}",
                 "cluster", "status"], capture_output=True, text=True, timeout=120)
            assert refused.returncode != 0 and "certificate verify failed" in refused.stderr, refused.stderr
        finally:
            cluster.stop_all()


async def test_the_peer_registry_rereads_on_a_miss_and_keeps_what_it_knew_while_the_database_is_down() -> None:
    from tierfs.cluster.host_credentials import CACHE_S, MISS_REREAD_S, PeerRegistry, token_digest
    from tierfs.contracts.errors import MetadataUnavailableError

    now = [0.0]
    registry_rows = {"a": token_digest("token-a")}
    reads = []

    async def read_digests() -> dict[str, str]:
        reads.append(now[0])
        if registry_rows is None:
            raise MetadataUnavailableError("postgresql://db", "it does not answer")
        return dict(registry_rows)

    peers = PeerRegistry(read_digests, clock=lambda: now[0])
    assert await peers.verify("a", b"token-a") and not await peers.verify("a", b"token-b")
    assert len(reads) == 1  # the wrong token came within MISS_REREAD_S: no second read
    registry_rows["b"] = token_digest("token-b")  # b joins
    now[0] += MISS_REREAD_S * 2
    assert await peers.verify("b", b"token-b") and len(reads) == 2  # an unknown id reads again at once
    del registry_rows["a"]  # a leaves
    assert await peers.verify("a", b"token-a")  # known a moment ago...
    now[0] += CACHE_S * 2
    assert not await peers.verify("a", b"token-a")  # ...refused once the cache is older than CACHE_S
    registry_rows = None  # type: ignore[assignment]  # the database goes down
    now[0] += CACHE_S * 2
    assert await peers.verify("b", b"token-b")  # the digests last read stay in use
    assert not await peers.verify("stranger", b"token-b")

    empty = PeerRegistry(read_digests, clock=lambda: now[0])
    with pytest.raises(MetadataUnavailableError):  # nothing known: the request fails, not a refusal
        await empty.verify("b", b"token-b")


def test_a_processes_clients_share_one_context_per_version_of_a_ca_file(tmp_path: Path) -> None:
    import os

    from tierfs.remote.tls import client_context
    from tierfs.testing.cluster import make_certificates

    ca = make_certificates(tmp_path / "one").ca
    first = client_context(str(ca))
    assert client_context(str(ca)) is first
    replaced = make_certificates(tmp_path / "two").ca
    os.replace(replaced, ca)  # a new CA in its place: read again
    assert client_context(str(ca)) is not first
