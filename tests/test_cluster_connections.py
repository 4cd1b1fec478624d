"""A cluster's PostgreSQL connections are bounded per daemon, whatever the number of
containers (issue 36 item 4): 64 containers on 3 daemons against a server with the stock
``max_connections`` (100), every container doing metadata work at once."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import psycopg

from tierfs.engine.metadata.connection_pool import DAEMON_CONNECTIONS
from tierfs.testing.cluster import Cluster

CONTAINERS = 64
DAEMONS = 3
PER_DAEMON = DAEMON_CONNECTIONS  # the pool's two lanes, the lease table's connection, the LISTEN


def test_64_containers_on_3_daemons_stay_within_a_stock_servers_connections(
        postgres_url: str, tmp_path: Path) -> None:
    port = urllib.parse.urlsplit(postgres_url).port
    assert port is not None
    with psycopg.connect(postgres_url) as admin:
        assert admin.execute("SHOW max_connections").fetchone() == ("100",)  # the stock setting
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=4.0)
    try:
        with cluster.connection_peaks(port) as peaks:
            cluster.start_together(range(DAEMONS))
            owners = cluster.wait_balanced(list(range(DAEMONS)))
            assert len(set(owners.values())) == DAEMONS
            expected = cluster.write_in_every_container(range(DAEMONS))  # every host, every container
        client = cluster.client(1)
        for name, data in expected.items():
            assert client.read(name) == data
        client.close()
    finally:
        cluster.stop_all()
    assert len(peaks) == DAEMONS and 0 < max(peaks.values()) <= PER_DAEMON, peaks
