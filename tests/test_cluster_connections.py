"""A cluster's PostgreSQL connections are bounded per daemon, whatever the number of
containers (issue 36 item 4): 64 containers on 3 daemons against a server with the stock
``max_connections`` (100), every container doing metadata work at once."""

from __future__ import annotations

import threading
import urllib.parse
from pathlib import Path

import psycopg

from tierfs.cluster.container_map import container_of
from tierfs.engine.metadata.connection_pool import POOL_CONNECTIONS
from tierfs.testing.cluster import Cluster, tcp_connections_to

CONTAINERS = 64
DAEMONS = 3
# the pool, the lease table's connection and the growth channel's LISTEN
PER_DAEMON = POOL_CONNECTIONS + 2


def test_64_containers_on_3_daemons_stay_within_a_stock_servers_connections(
        postgres_url: str, tmp_path: Path) -> None:
    port = urllib.parse.urlsplit(postgres_url).port
    assert port is not None
    with psycopg.connect(postgres_url) as admin:
        assert admin.execute("SHOW max_connections").fetchone() == ("100",)  # the stock setting
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=4.0)
    peaks = [0] * DAEMONS
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for index, daemon in list(cluster.daemons.items()):
                try:
                    peaks[index] = max(peaks[index], tcp_connections_to(daemon.proc.pid, port))
                except OSError:
                    pass  # it is starting or gone
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        starting = [threading.Thread(target=cluster.start, args=(index,)) for index in range(DAEMONS)]
        for thread in starting:  # together: each takes its share at once, none opens all 64 first
            thread.start()
        for thread in starting:
            thread.join()
        owners = cluster.wait_balanced(list(range(DAEMONS)))
        assert len(set(owners.values())) == DAEMONS
        clients = [cluster.client(index) for index in range(DAEMONS)]
        tops: dict[int, str] = {}  # one top-level directory in each container
        for index in range(CONTAINERS * 20):
            tops.setdefault(container_of(f"d{index}", CONTAINERS), f"d{index}")
        assert len(tops) == CONTAINERS

        def write(index: int) -> None:  # every host creates and appends in every container
            for top in tops.values():
                name = f"{top}/from-{index}"
                clients[index].create(name, parents=True)
                clients[index].append(name, f"{name}\n".encode())

        writers = [threading.Thread(target=write, args=(index,)) for index in range(DAEMONS)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        for top in tops.values():
            for index in range(DAEMONS):
                name = f"{top}/from-{index}"
                assert clients[(index + 1) % DAEMONS].read(name) == f"{name}\n".encode()
        for client in clients:
            client.close()
    finally:
        done.set()
        watcher.join()
        cluster.stop_all()
    assert 0 < max(peaks) <= PER_DAEMON, peaks
