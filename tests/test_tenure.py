"""Nothing is acknowledged by an owner that may no longer own: an append whose lease
lapsed before its acknowledgement is refused (and lands once when sent again with its
writer identity), readers are not shown what was synced meanwhile, and a renewal shows
it. In-process, with a lease the test moves by hand."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts.cluster_errors import LeaseLapsedError, LeaseLapsedWhileOpeningError
from tierfs.contracts.writers import Writer
from tierfs.engine.ownership.tenure import Lease, lease_margin_s
from tierfs.testing.harness import small_config


class HandLease(Lease):
    """A lease valid while ``held`` is set (the test plays the renewals)."""

    def __init__(self) -> None:
        super().__init__(container=3, lease_s=10.0)
        self.held = True

    def valid(self) -> bool:
        return self.held

    def lapse(self) -> None:
        self.held = False

    def renew(self) -> None:
        self.held = True
        for callback in self.on_regained:
            callback()


def test_a_lease_counts_from_when_its_renewal_was_sent() -> None:
    lease = Lease(container=1, lease_s=10.0)
    assert not lease.valid()
    sent_s = time.monotonic() - 9.0  # a renewal that took nine seconds to come back
    regained: list[int] = []
    lease.on_regained.append(lambda: regained.append(1))
    lease.renewed(sent_s)
    assert lease.valid_until_s == pytest.approx(sent_s + 10.0 - lease_margin_s(10.0))
    assert not lease.valid() and regained == []  # 9 s of 10 gone: within the margin, not counted on
    lease.renewed(time.monotonic())
    assert lease.valid() and regained == [1]
    lease.renewed(sent_s)  # an older renewal answered late never moves it back
    assert lease.valid()


async def test_appends_are_refused_once_the_lease_lapsed(tmp_path: Path) -> None:
    lease = HandLease()
    async with open_store(small_config(tmp_path / "d"), lease=lease) as store:
        await store.create("pd")
        await store.create("vd", durability="vd")
        assert await store.append("pd", b"one") == 0
        lease.lapse()
        for name in ("pd", "vd"):
            with pytest.raises(LeaseLapsedError, match="c003"):
                await store.append(name, b"refused")
        assert (await store.stat("pd")).appended_length == 3  # refused before anything changed
        lease.renew()
        assert await store.append("pd", b"two") == 3


async def test_an_append_whose_lease_lapses_before_its_sync_is_refused_and_lands_once(tmp_path: Path) -> None:
    lease = HandLease()
    async with open_store(small_config(tmp_path / "d"), lease=lease) as store:
        await store.create("s")
        await store.append("s", b"seen ")
        identity = Writer().next()
        refused: list[BaseException] = []

        async def append() -> None:
            try:
                await store.append("s", b"paused", writer=identity)
            except LeaseLapsedError as e:
                refused.append(e)

        journal = store.journal
        synced = journal._on_durable

        def lapse_then_report(lsn: int) -> None:  # the lease lapses while the fdatasync runs
            lease.lapse()
            synced(lsn)

        journal._on_durable = lapse_then_report
        await append()
        journal._on_durable = synced
        assert len(refused) == 1
        assert await store.read("s") == b"seen "  # synced, not shown: another owner may not have it
        assert await store.read("s", unconfirmed=True) == b"seen paused"
        lease.renew()  # the same owner after all: what it kept becomes durable
        assert await store.read("s") == b"seen paused"
        assert await store.append("s", b"paused", writer=identity) == 5  # sent again: found, not appended
        assert await store.read("s") == b"seen paused"


async def test_an_open_whose_lease_lapsed_claims_nothing(tmp_path: Path) -> None:
    """A daemon paused while it opened a container wakes with its lease lapsed: it must
    not claim tier-2 over the daemon that took the container meanwhile."""
    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "tier2"))
    async with open_store(config) as store:  # the owner that took the container
        await store.create("kept")
        await store.append("kept", b"acknowledged")
        epoch = store.epoch
    config = small_config(tmp_path / "paused", tier2_url=str(tmp_path / "tier2"), takeover=True)
    lease = HandLease()
    lease.lapse()
    with pytest.raises(LeaseLapsedWhileOpeningError, match="tier-2 was not claimed"):
        async with open_store(config, lease=lease):
            pass
    assert not (tmp_path / "paused" / "owner-claim.json").exists()
    async with open_store(small_config(tmp_path / "d", tier2_url=str(tmp_path / "tier2"))) as store:
        assert store.epoch == epoch + 1, "the owner's data dir still holds the newest claim"
        assert await store.read("kept") == b"acknowledged"
