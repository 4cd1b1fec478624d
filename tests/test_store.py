"""Segment operations through the engine API."""

from __future__ import annotations

import random

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import (
    BadOffsetError,
    DirectoryNotEmptyError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.contracts.reports.info import DirectoryInfo, SegmentInfo
from tierfs.store.facade import SegmentStore


async def test_create_append_read_stat(store: SegmentStore) -> None:
    info = await store.create("a")
    assert (info.length, info.sealed, info.durability, info.chunk_count) == (0, False, "pd", 0)
    assert await store.append("a", b"hello ") == 0
    assert await store.append("a", b"world") == 6
    assert await store.read("a") == b"hello world"
    assert await store.read("a", 6, 3) == b"wor"
    assert await store.read("a", 11) == b""
    stat = await store.stat("a")
    assert isinstance(stat, SegmentInfo)
    assert (stat.length, stat.durable_length, stat.appended_length) == (11, 11, 11)
    assert stat.created <= stat.modified


async def test_conditional_append(store: SegmentStore) -> None:
    await store.create("c")
    assert await store.append("c", b"abc", expected_offset=0) == 0
    with pytest.raises(BadOffsetError) as excinfo:
        await store.append("c", b"zzz", expected_offset=0)
    assert (excinfo.value.expected, excinfo.value.actual) == (0, 3)
    assert await store.read("c") == b"abc"
    assert await store.append("c", b"def", expected_offset=3) == 3


async def test_directories(store: SegmentStore) -> None:
    await store.mkdir("logs")
    await store.create("logs/app.log")
    await store.mkdir("logs/old")
    with pytest.raises(SegmentNotFoundError):
        await store.create("nodir/x")
    await store.create("deep/er/x", make_parents=True)
    listing = await store.list("logs")
    assert [(e.name, e.type) for e in listing] == [("logs/app.log", "segment"), ("logs/old", "directory")]
    assert isinstance(await store.stat("logs"), DirectoryInfo)
    assert {e.name for e in await store.list()} == {"logs", "deep"}
    with pytest.raises(DirectoryNotEmptyError):
        await store.rmdir("logs")
    await store.rmdir("logs/old")
    with pytest.raises(SegmentExistsError):
        await store.mkdir("logs/app.log")
    with pytest.raises(SegmentExistsError):
        await store.create("logs")


async def test_seal_unseal(store: SegmentStore) -> None:
    await store.create("s")
    await store.append("s", b"1")
    info = await store.seal("s")
    assert info.sealed
    with pytest.raises(SegmentSealedError):
        await store.append("s", b"2")
    await store.unseal("s")
    await store.append("s", b"2")
    assert await store.read("s") == b"12"


async def test_delete_and_rename(store: SegmentStore) -> None:
    await store.create("x")
    await store.append("x", b"data" * 1000)
    await store.flush("x")
    await store.rename("x", "y")
    with pytest.raises(SegmentNotFoundError):
        await store.stat("x")
    assert await store.read("y") == b"data" * 1000
    await store.mkdir("d")
    await store.rename("y", "d/y")
    await store.rename("d", "e")
    assert await store.read("e/y") == b"data" * 1000
    layout_before = await store.chunk_layout("e/y")
    assert layout_before and all("e/y" not in c["name"] for c in layout_before)
    await store.delete("e/y")
    with pytest.raises(SegmentNotFoundError):
        await store.read("e/y")
    await store.create("e/y")  # the name is free again, with a new id
    assert await store.read("e/y") == b""


async def test_concurrent_appenders_never_interleave(store: SegmentStore) -> None:
    await store.create("shared")
    acked: list[tuple[int, bytes]] = []

    async def writer(w: int) -> None:
        for i in range(40):
            record = (f"<{w}:{i}:" + "x" * random.randint(1, 300) + ">").encode()
            acked.append((await store.append("shared", record), record))

    async with trio.open_nursery() as nursery:
        for w in range(8):
            nursery.start_soon(writer, w)
    data = await store.read("shared")
    for offset, record in acked:
        assert data[offset : offset + len(record)] == record
    assert sum(len(r) for _, r in acked) == len(data)


async def test_reads_span_chunks_and_tail(store: SegmentStore) -> None:
    await store.create("big")
    expected = bytearray()
    for i in range(300):
        record = bytes([i % 251]) * random.randint(100, 4000)
        await store.append("big", record)
        expected += record
        if i == 200:
            await store.flush("big")
    info = await store.stat("big")
    assert 0 < info.flushed_length < info.length
    assert info.chunk_count >= 2
    assert await store.read("big") == bytes(expected)
    for _ in range(50):
        start = random.randrange(len(expected))
        length = random.randrange(1, 300_000)
        assert await store.read("big", start, length) == bytes(expected[start : start + length])


async def test_data_survives_restart(config) -> None:  # type: ignore[no-untyped-def]
    async with open_store(config) as store:
        await store.create("r", durability="vd")
        await store.append("r", b"kept")
        first_epoch = store.epoch
    async with open_store(config) as store:
        assert await store.read("r") == b"kept"
        assert store.epoch == first_epoch + 1
        assert (await store.stat("r")).durability == "vd"


async def test_second_opener_is_refused(config) -> None:  # type: ignore[no-untyped-def]
    from tierfs.contracts.errors import StoreInUseError

    async with open_store(config):
        with pytest.raises(StoreInUseError, match="in use by pid"):
            async with open_store(config):
                pass


async def test_wait_for_data_wakes_on_append(store: SegmentStore) -> None:
    await store.create("t")
    woke: list[int] = []

    async def waiter() -> None:
        woke.append(await store.wait_for_data("t", 0, timeout_s=5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.05)
        assert not woke
        await store.append("t", b"now")
    assert woke == [3]
    assert await store.wait_for_data("t", 3, timeout_s=0.01) == 3
