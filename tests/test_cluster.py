"""Many daemons, one namespace (cluster mode), on one machine as several hosts: three
real daemons with their own data dirs and ports on one real PostgreSQL and one tier-2.
Appends through every host to containers owned by others, failover after kill -9, a
zombie owner that wakes up after its lease was taken, rebalancing on join and leave."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.cluster.container_map import container_of
from tierfs.contracts.cluster_errors import CrossContainerError
from tierfs.testing.cluster import Cluster

CONTAINERS = 6


def top_names(count: int = CONTAINERS) -> dict[int, str]:
    """One top-level name per container."""
    found: dict[int, str] = {}
    index = 0
    while len(found) < count:
        found.setdefault(container_of(f"t{index}", count), f"t{index}")
        index += 1
    return found


@pytest.fixture
def cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=2.0)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_every_host_serves_the_whole_namespace_and_forwards_writes(cluster: Cluster) -> None:
    for index in range(3):
        cluster.start(index)
    owners = cluster.wait_balanced([0, 1, 2])
    assert sorted(owners) == list(range(CONTAINERS))
    clients = [cluster.client(i) for i in range(3)]
    tops = top_names()
    expected: dict[str, bytes] = {}
    for container, top in tops.items():
        clients[container % 3].op("mkdir", path=top)
        name = f"{top}/log"
        clients[(container + 1) % 3].create(name)
        for host, client in enumerate(clients):  # every host appends, whoever owns it
            data = f"{name} from host {host}\n".encode()
            client.append(name, data)
            expected[name] = expected.get(name, b"") + data
    for client in clients:
        assert sorted(i.name for i in client.ls("")) == sorted(tops.values())
        for name, data in expected.items():
            assert client.read(name) == data
            assert client.stat(name).length == len(data)
    clients[0].op("flush")
    for client in clients:
        for name, data in expected.items():
            assert client.read(name) == data
    # a rename inside a top-level entry is metadata-only on its owner; across containers it
    # is refused before anything changes (EXDEV on the mount: mv copies)
    first, second = tops[0], tops[1]
    clients[2].op("mv", source=f"{first}/log", target=f"{first}/renamed")
    assert clients[1].read(f"{first}/renamed") == expected[f"{first}/log"]
    with pytest.raises(CrossContainerError):
        clients[0].op("mv", source=f"{first}/renamed", target=f"{second}/moved")
    assert clients[0].read(f"{first}/renamed") == expected[f"{first}/log"]
    report = clients[1].op("fsck")
    assert report["problems"] == [] and report["segments"] == CONTAINERS, report
    for client in clients:
        client.close()
