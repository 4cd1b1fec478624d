"""A cluster daemon keeps renewing the leases of the containers it serves while it
opens another one slowly (a journal replay, a loaded host): none of them expires, so
no other daemon takes a container whose owner still acknowledges appends (those would
end in lost+found); and a container whose store another owner fenced while it was being
given back is treated as lost while the daemon serves its other containers on. The lease
table is a fake with the real one's rules; the stores are fakes whose open takes as long
as the test says."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tierfs.cluster import container_host
from tierfs.cluster.container_host import ContainerHost, tick_s
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import Tier2Error

LEASE_S = 0.6
SLOW_OPEN_S = 4 * LEASE_S  # far longer than a lease


@dataclasses.dataclass
class _Lease:
    owner: str | None = None
    epoch: int = 0
    expires_s: float = 0.0


class FakeLeaseTable:
    """``LeaseTable``'s rules in memory: acquire only a free, expired or own lease (raising
    its epoch), renew only at the acquired epoch; remembers every lapse (a held lease
    found expired when renewed)."""

    def __init__(self, count: int) -> None:
        self.leases = {c: _Lease() for c in range(count)}
        self.lapses: list[tuple[int, float]] = []  # (container, seconds past its expiry)
        self._lock = threading.Lock()

    def heartbeat(self, daemon_id: str, url: str, token_sha256: str, append_url: str = "") -> None:
        pass

    def leave(self, daemon_id: str) -> None:
        pass

    def epochs(self) -> dict[int, int]:
        return {c: lease.epoch for c, lease in self.leases.items()}

    def owners(self) -> dict[int, Any]:
        return {}

    def any_free_or_expired(self) -> bool:
        return any(lease.owner is None or self._expired(lease) for lease in self.leases.values())

    def live_daemons(self, lease_s: float) -> dict[str, bool]:
        return {owner: False for owner in [lease.owner for lease in self.leases.values() if lease.owner][:1]}

    def _expired(self, lease: _Lease) -> bool:
        return lease.owner is not None and lease.expires_s < time.monotonic()

    def expired(self, lease_s: float) -> list[int]:
        return [c for c, lease in self.leases.items() if self._expired(lease)]

    def free(self, lease_s: float) -> list[int]:
        return [c for c, lease in self.leases.items() if lease.owner is None]

    def free_or_expired(self, lease_s: float) -> list[int]:
        return [c for c, lease in self.leases.items() if lease.owner is None or self._expired(lease)]

    def acquire(self, container: int, daemon_id: str, lease_s: float) -> int | None:
        with self._lock:
            lease = self.leases[container]
            if lease.owner not in (None, daemon_id) and not self._expired(lease):
                return None
            lease.owner, lease.epoch, lease.expires_s = daemon_id, lease.epoch + 1, time.monotonic() + lease_s
            return lease.epoch

    def renew(self, daemon_id: str, held: dict[int, int], lease_s: float) -> set[int]:
        renewed = set()
        with self._lock:
            now_s = time.monotonic()
            for container, epoch in held.items():
                lease = self.leases[container]
                if lease.owner == daemon_id and lease.epoch == epoch:
                    if lease.expires_s < now_s:
                        self.lapses.append((container, now_s - lease.expires_s))
                    lease.expires_s = now_s + lease_s
                    renewed.add(container)
        return renewed

    def release(self, container: int, daemon_id: str, epoch: int) -> None:
        with self._lock:
            lease = self.leases[container]
            if lease.owner == daemon_id and lease.epoch == epoch:
                lease.owner, lease.expires_s = None, 0.0


class FakeStore:
    def __init__(self) -> None:
        self.growth_listeners: list[Any] = []
        self.fence = type("Fence", (), {"fenced": False})()
        self.table = type("Table", (), {"in_memory": staticmethod(lambda: [])})()

    async def flush(self) -> None:
        pass

    def statistics(self) -> Any:
        return type("Statistics", (), {"unflushed_bytes": 0})()


@pytest.fixture
def slow_second_open(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stores open at once, except container c001's, which takes ``SLOW_OPEN_S``."""
    opened: list[str] = []

    @asynccontextmanager
    async def open_store(config: StoreConfig, lease: object = None) -> AsyncIterator[FakeStore]:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        if config.data_dir.name == "c001":
            await trio.sleep(SLOW_OPEN_S)
        opened.append(config.data_dir.name)
        yield FakeStore()

    monkeypatch.setattr(container_host, "open_store", open_store)
    return opened


async def test_leases_are_renewed_while_another_container_opens_slowly(
    tmp_path: Path, slow_second_open: list[str]
) -> None:
    leases = FakeLeaseTable(count=2)
    config = StoreConfig(data_dir=tmp_path, lease_s=LEASE_S, metadata_url="postgresql://nowhere/cluster")
    host = ContainerHost(config, leases, 2, "daemon-a", "http://127.0.0.1:1", "token")  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(host.run)
        await trio.sleep(SLOW_OPEN_S + 3 * tick_s(LEASE_S))
        assert slow_second_open == ["c000", "c001"]
        assert sorted(host.stores) == [0, 1], "both containers are served"
        assert leases.lapses == [], "a served container's lease expired while c001 was opening"
        assert {c: lease.epoch for c, lease in leases.leases.items()} == {0: 1, 1: 1}, "never taken again"
        host.stop()
    assert all(lease.owner is None for lease in leases.leases.values()), "given back at stop"


class FencedWhenFlushedStore(FakeStore):
    """A store another owner claimed while it was being given back: its flush fails."""

    async def flush(self) -> None:
        self.fence.fenced = True
        raise Tier2Error("flush of 't/x' failed: fenced: this store (epoch 2) lost tier-2 to epoch 3")


async def test_a_container_fenced_while_given_back_is_lost_and_the_daemon_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @asynccontextmanager
    async def open_store(config: StoreConfig, lease: object = None) -> AsyncIterator[FakeStore]:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        yield FencedWhenFlushedStore() if config.data_dir.name == "c001" else FakeStore()

    monkeypatch.setattr(container_host, "open_store", open_store)
    leases = FakeLeaseTable(count=2)
    config = StoreConfig(data_dir=tmp_path, lease_s=LEASE_S, metadata_url="postgresql://nowhere/cluster")
    host = ContainerHost(config, leases, 2, "daemon-a", "http://127.0.0.1:1", "token")  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(host.run)
        while sorted(host.stores) != [0, 1]:
            await trio.sleep(0.01)
        host._drop(1, lost=False)  # balance gives c001 back; its flush meets the fence
        while 1 in host.held:
            await trio.sleep(0.01)
        assert sorted(host.stores) == [0], "c000 is still served"
        assert leases.leases[1].owner == "daemon-a", "a fenced container's lease is not given back as clean"
        assert not (tmp_path / "containers" / "c001").exists()  # no journal bytes: nothing to keep aside
        host.stop()
    assert leases.leases[0].owner is None, "c000 given back at stop"
