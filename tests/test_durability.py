"""BP-14 durability levels: PD acks after fdatasync, VD after write(2); LAC (tier2:
tests/test_tier2_durability.py)."""

from __future__ import annotations

import pytest
import trio

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.store.facade import SegmentStore


async def test_pd_append_is_durable_when_acknowledged(store: SegmentStore) -> None:
    await store.create("pd", durability="pd")
    await store.append("pd", b"abc")
    assert store.journal.durable_lsn == store.journal.written_lsn
    info = await store.stat("pd")
    assert info.length == info.durable_length == info.appended_length == 3


async def test_vd_readers_stop_at_the_durable_length(store: SegmentStore) -> None:
    await store.create("vd", durability="vd")
    syncs_before = store.journal.syncs
    await store.append("vd", b"volatile")
    info = await store.stat("vd")
    assert info.appended_length == 8
    assert info.length == info.durable_length == 0
    assert await store.read("vd") == b""
    assert await store.read("vd", unconfirmed=True) == b"volatile"
    assert store.journal.syncs == syncs_before
    assert await store.sync("vd") == 8
    assert await store.read("vd") == b"volatile"


async def test_vd_is_synced_within_the_interval(store: SegmentStore) -> None:
    await store.create("vd", durability="vd")
    await store.append("vd", b"x")
    interval = store.config.vd_sync_interval_s
    start = trio.current_time()
    with trio.fail_after(interval * 5 + 1):
        await store.wait_for_data("vd", 0, timeout_s=interval * 5)
    assert (await store.stat("vd")).durable_length == 1
    assert trio.current_time() - start <= interval * 5


async def test_set_durability_only_while_empty(store: SegmentStore) -> None:
    await store.create("d")
    assert (await store.set_durability("d", "vd")).durability == "vd"
    await store.append("d", b"1")
    with pytest.raises(InvalidArgumentError):
        await store.set_durability("d", "pd")
    with pytest.raises(InvalidArgumentError):
        await store.create("e", durability="weak")

