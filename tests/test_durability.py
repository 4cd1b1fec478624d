"""BP-14 durability levels: PD acks after fdatasync, VD after write(2); LAC; and tier2,
acknowledged once the bytes are in tier-2 and committed (group-committed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.store.facade import SegmentStore, open_store
from tierfs.testing.harness import small_config
from tierfs.testing.storages import FlakyStorage


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


async def test_a_tier2_append_is_acknowledged_once_in_tier2_and_committed(store: SegmentStore) -> None:
    await store.create("t2", durability="tier2")
    offset = await store.append("t2", b"survives the host")
    info = await store.stat("t2")
    assert offset == 0 and info.flushed_length == info.length == 17
    chunks = await store.chunk_layout("t2")
    assert [(c["start"], c["end"]) for c in chunks] == [(0, 17)]
    assert store.chunk_storage.read(chunks[0]["name"], 0, 17) == b"survives the host"


async def test_tier2_appends_are_group_committed(store: SegmentStore) -> None:
    await store.create("t2", durability="tier2")
    flushes_before = store.statistics().flushes
    offsets: list[int] = []

    async def one(i: int) -> None:
        offsets.append(await store.append("t2", b"record %03d\n" % i))

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)
    info = await store.stat("t2")
    assert info.flushed_length == info.length == 200 * 11
    assert sorted(offsets) == [i * 11 for i in range(200)]
    flushes = store.statistics().flushes - flushes_before
    assert flushes <= 200 // 4, flushes  # one chunk write + commit serves many appends


async def test_a_tier2_append_waits_through_a_tier2_outage(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_retry_initial_s=0.01, tier2_retry_max_s=0.05)
    async with open_store(config) as store:
        flaky = FlakyStorage(store.chunk_storage)
        store.chunk_storage = flaky
        await store.create("t2", durability="tier2")
        acknowledged = trio.Event()

        async def append() -> None:
            await store.append("t2", b"waits for tier-2")
            acknowledged.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            with trio.fail_after(30):
                while flaky.attempts < 3:  # the writer retries with its backoff
                    await trio.sleep(0.01)
            assert not acknowledged.is_set()  # never before the bytes are in tier-2
            assert (await store.stat("t2")).flushed_length == 0
            flaky.failing = False
            await acknowledged.wait()
        assert (await store.stat("t2")).flushed_length == 16
