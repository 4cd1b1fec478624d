"""The read path against S3 tier-2 (moto server on 127.0.0.1): block cache, single
flight, read-ahead, tail + chunk reads, tail waits, bounded memory, CRC checks, retries."""

from __future__ import annotations

import errno
import random
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import DataCorruptionError, Tier2Error
from tierfs.engine.tier2.chunk_storage import FsspecChunkStorage
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import small_config
from tierfs.testing.storages import CountingStorage

MiB = 1 << 20


def s3_config(tmp_path: Path, s3_bucket, **overrides):  # type: ignore[no-untyped-def]
    url, options = s3_bucket
    values = dict(
        tier2_url=url, tier2_options=options, max_chunk_bytes=4 * MiB, max_flush_bytes=4 * MiB,
        flush_bytes=4 * MiB,
    )
    values.update(overrides)
    return small_config(tmp_path / "data", **values)


async def _segment_in_s3(store: SegmentStore, name: str, size: int) -> bytes:
    payload = random.Random(size).randbytes(size)
    await store.create(name)
    for start in range(0, size, MiB):
        await store.append(name, payload[start : start + MiB])
    await store.flush(name)
    return payload


@pytest.fixture
async def s3_store(tmp_path: Path, s3_bucket) -> AsyncIterator[SegmentStore]:  # type: ignore[no-untyped-def]
    async with open_store(s3_config(tmp_path, s3_bucket, block_cache_bytes=8 * MiB)) as store:
        store.chunk_storage = CountingStorage(store.chunk_storage)
        yield store


def _counter(store: SegmentStore) -> CountingStorage:
    assert isinstance(store.chunk_storage, CountingStorage)
    return store.chunk_storage


def _blocks_read(reads: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    """(chunk, block) of every block the ranged reads covered (a run covers several)."""
    return {(name, block) for name, start, end in reads for block in range(start // MiB, (end - 1) // MiB + 1)}


async def test_reads_resolve_across_chunks_and_the_tail(s3_store: SegmentStore) -> None:
    payload = await _segment_in_s3(s3_store, "s", 10 * MiB + 12345)
    assert len(await s3_store.chunk_layout("s")) >= 3
    await s3_store.append("s", b"tail-bytes")
    expected = payload + b"tail-bytes"
    assert await s3_store.read("s") == expected
    for _ in range(20):
        start = random.randrange(len(expected))
        length = random.randrange(1, 5 * MiB)
        assert await s3_store.read("s", start, length) == expected[start : start + length]


async def test_cache_is_bounded_by_bytes(s3_store: SegmentStore) -> None:
    await _segment_in_s3(s3_store, "big", 12 * MiB)
    await s3_store.read("big")
    stats = s3_store.block_cache.statistics()
    assert stats.used_bytes <= 8 * MiB
    assert stats.evictions >= 4
    assert stats.gets == 12 and stats.fetched_bytes == 12 * MiB


async def test_concurrent_misses_on_a_block_make_one_get(s3_store: SegmentStore) -> None:
    await _segment_in_s3(s3_store, "sf", 3 * MiB)
    counter = _counter(s3_store)
    counter.reads.clear()
    async with trio.open_nursery() as nursery:
        for i in range(24):  # overlapping reads, like kernel read-ahead through FUSE
            nursery.start_soon(s3_store.read, "sf", (i % 4) * 100_000, 2 * MiB)
    assert sorted(counter.reads) == sorted(set(counter.reads))
    assert len(counter.reads) == 3  # blocks 0, 1 and 2 of the one chunk, once each
    assert s3_store.block_cache.statistics().hits >= 24


async def test_readahead_grows_doubling_and_resets_on_a_seek(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    config = s3_config(tmp_path, s3_bucket, block_cache_bytes=64 * MiB, readahead_max_bytes=8 * MiB)
    async with open_store(config) as store:
        await _segment_in_s3(store, "ra", 24 * MiB)
        store.chunk_storage = counter = CountingStorage(store.chunk_storage)
        store.block_cache = type(store.block_cache)(64 * MiB)  # cold cache
        reader = store.open_reader("ra")
        windows = []
        for i in range(6):
            await reader.read(i * 128 * 1024, 128 * 1024)
            windows.append(reader.window_bytes)
        assert windows == [1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 8 * MiB, 8 * MiB]
        prefetched = reader.statistics().prefetched_blocks
        assert prefetched >= 4  # the window's runs (how many depends on where flushes cut chunks)
        with trio.fail_after(10):
            # every prefetched block arrives (block 0 was read); the end of the window,
            # shorter than a run, waits until the reader moves on and can join a whole run
            while len(_blocks_read(counter.reads)) < prefetched + 1:
                await trio.sleep(0.01)
        assert len(_blocks_read(counter.reads)) == prefetched + 1  # none fetched twice
        gets_before = len(counter.reads)
        data = await reader.read(6 * 128 * 1024, 128 * 1024)  # sequential, already cached
        assert len(data) == 128 * 1024
        await reader.read(20 * MiB, 4096)  # a seek: random
        assert reader.window_bytes == 0
        assert reader.statistics().sequential_reads == 7
        await trio.sleep(0.2)
        new_blocks = _blocks_read(counter.reads[gets_before:])
        assert len(new_blocks) <= 3, "a random read must not trigger read-ahead"
        stats = store.block_cache.statistics()
        assert stats.gets == len(counter.reads)  # every GET went through the cache once


async def test_sequential_scan_fetches_each_block_once_in_fewer_gets(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    config = s3_config(tmp_path, s3_bucket, block_cache_bytes=64 * MiB)
    async with open_store(config) as store:
        payload = await _segment_in_s3(store, "scan", 16 * MiB)
        store.chunk_storage = counter = CountingStorage(store.chunk_storage)
        store.block_cache = type(store.block_cache)(64 * MiB)
        reader = store.open_reader("scan")
        out = bytearray()
        while len(out) < len(payload):
            out += await reader.read(len(out), 256 * 1024)
        assert bytes(out) == payload
        await trio.sleep(0.1)
        blocks = [(name, block) for name, start, end in counter.reads
                  for block in range(start // MiB, (end - 1) // MiB + 1)]
        assert sorted(blocks) == sorted(set(blocks)) and len(blocks) == 16  # each block once
        assert len(counter.reads) < 16  # runs of adjacent blocks once the window grew
        assert store.block_cache.statistics().gets == len(counter.reads)


async def test_tail_reader_wakes_on_durable_append(s3_store: SegmentStore) -> None:
    await s3_store.create("follow", durability="vd")
    woke_at: list[float] = []

    async def follower() -> None:
        await s3_store.wait_for_data("follow", 0, timeout_s=10)
        woke_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower)
        await trio.sleep(0.05)
        await s3_store.append("follow", b"not yet durable")
        await trio.sleep(0.02)
        assert not woke_at, "VD bytes are not durable before the sync: no wake-up"
        synced_at = trio.current_time()
        await s3_store.sync("follow")
    assert woke_at and woke_at[0] - synced_at < 0.5
    assert await s3_store.read("follow") == b"not yet durable"


async def test_large_unflushed_backlog_keeps_memory_bounded(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    config = s3_config(
        tmp_path, s3_bucket, tail_memory_bytes=2 * MiB, flush_bytes=1 << 30, flush_interval_s=3600,
        tail_keep_max_bytes=MiB,  # every append is kept until the budget forces it out
    )
    async with open_store(config) as store:
        await store.create("backlog")
        for i in range(32):
            await store.append("backlog", bytes([i]) * (512 * 1024))
        assert store.tail_budget.used_bytes <= 2 * MiB + 512 * 1024
        assert store.statistics().unflushed_bytes == 16 * MiB
        assert store.tail_budget.evicted_entries >= 27
        data = await store.read("backlog", 3 * MiB, 2 * MiB)  # re-read from the journal
        assert data == b"".join(bytes([i]) * (512 * 1024) for i in range(6, 10))
        await store.flush("backlog")
        assert (await store.read("backlog", 31 * 512 * 1024)) == bytes([31]) * (512 * 1024)


@pytest.mark.parametrize("durability", ["vd", "pd"])
async def test_large_appends_leave_memory_once_written(tmp_path: Path, durability: str) -> None:
    config = StoreConfig(data_dir=tmp_path, durability=durability, flush_bytes=1 << 30,
                         flush_interval_s=3600, tail_keep_max_bytes=64 * 1024)
    payloads = [bytes([i]) * (256 * 1024) for i in range(8)]
    async with open_store(config) as store:
        await store.create("big")
        await store.create("small")
        for payload in payloads:
            await store.append("big", payload)
            await store.append("small", payload[: 64 * 1024])
        await store.sync("big")
        assert store.tail_budget.released_large_entries == 8
        assert store.tail_budget.used_bytes == 8 * 64 * 1024  # only the small appends
        assert store.tail_budget.evicted_entries == 0
        # tail readers and the storage writer read the large appends from the journal
        assert await store.read("big", 100, 512 * 1024) == b"".join(payloads)[100 : 100 + 512 * 1024]
        assert await store.read("big") == b"".join(payloads)
        await store.flush("big")
        assert await store.read("big") == b"".join(payloads)
    async with open_store(config) as store:  # and after a restart (journal replay)
        assert await store.read("big") == b"".join(payloads)
        assert await store.read("small") == b"".join(p[: 64 * 1024] for p in payloads)


async def test_corrupted_s3_object_fails_the_read(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = s3_bucket
    async with open_store(s3_config(tmp_path, s3_bucket)) as store:
        await _segment_in_s3(store, "bad", 2 * MiB)
        # the chunk holding segment byte MiB + 7 (a background flush may have cut the
        # segment into more chunks than the explicit flush alone would)
        chunk = next(c for c in await store.chunk_layout("bad") if c["start"] <= MiB + 7 < c["end"])
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")
    key = f"{prefix}/{chunk['name']}"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    position = MiB + 7 - chunk["start"]
    body[position] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    block = position // MiB
    block_length = min(chunk["end"] - chunk["start"] - block * MiB, MiB)
    async with open_store(s3_config(tmp_path, s3_bucket)) as store:
        assert len(await store.read("bad", 0, 1000)) == 1000
        with pytest.raises(DataCorruptionError, match="CRC32C"):
            await store.read("bad", MiB, 10)
        assert store.block_cache.peek((chunk["name"], block, block_length)) is None


def test_transient_errors_are_retried_then_reported(s3_bucket, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url, options = s3_bucket
    storage = FsspecChunkStorage(url, options)
    storage.write("c", 0, b"0123456789")
    real_cat = storage.read_fs._cat_file  # reads go through the read filesystem's coroutine
    failures = {"left": 2}

    async def flaky_cat(path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EBUSY, "503 SlowDown")
        return await real_cat(path, start=start, end=end, **kwargs)

    monkeypatch.setattr(storage.read_fs, "_cat_file", flaky_cat)
    assert storage.read("c", 2, 5) == b"234"
    failures["left"] = 100
    with pytest.raises(Tier2Error, match="after 8 attempts"):
        storage.read("c", 0, 1)

    async def denied(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(storage.read_fs, "_cat_file", denied)
    with pytest.raises(Tier2Error, match="refused access"):
        storage.read("c", 0, 1)
