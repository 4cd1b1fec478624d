"""Run fetches against S3 tier-2 (moto server on 127.0.0.1, and the fault proxy): a
sequential reader's read-ahead fetches adjacent blocks with one streamed ranged GET, a
random read fetches one block, a corrupt block of a run fails alone, readers of blocks
of a run in flight share it, a stalled run is hedged and the read completes."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import DataCorruptionError
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.store.facade import SegmentStore
from tierfs.testing.faults.fault_proxy import FaultProxy, Faults
from tierfs.testing.harness import small_config
from tierfs.testing.storages import CountingStorage

MiB = 1 << 20
SIZE = 16 * MiB  # two chunk objects of 8 MiB


def s3_config(tmp_path: Path, url: str, options: dict[str, object], **overrides: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = dict(
        tier2_url=url, tier2_options=options, max_chunk_bytes=8 * MiB, max_flush_bytes=8 * MiB,
        flush_bytes=1 << 30, flush_interval_s=3600,  # only write_segment's flush: 8 MiB chunks
        block_cache_bytes=64 * MiB, readahead_max_bytes=16 * MiB,
    )
    values.update(overrides)
    return small_config(tmp_path / "data", **values)


async def write_segment(store: SegmentStore, name: str, size: int = SIZE) -> bytes:
    payload = random.Random(size).randbytes(size)
    await store.create(name)
    for start in range(0, size, MiB):
        await store.append(name, payload[start : start + MiB])
    await store.flush(name)
    return payload


def blocks_read(reads: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """(chunk, block) of every block the ranged reads covered, repeats kept."""
    return [(name, block) for name, start, end in reads for block in range(start // MiB, (end - 1) // MiB + 1)]


async def start_run(store: SegmentStore, name: str, start: int, end: int, run_blocks: int) -> int:
    """Read-ahead of [start, end) in runs of ``run_blocks``, as a sequential reader's."""
    await store.chunk_layout(name)  # the chunk list is loaded
    return store.reader.prefetch(store.table.segment(name), start, end, run_blocks)


async def test_a_sequential_scan_fetches_each_block_once_in_fewer_gets_than_blocks(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    config = s3_config(tmp_path, *s3_bucket)
    async with open_store(config) as store:
        payload = await write_segment(store, "scan")
    async with open_store(config) as store:  # an empty block cache
        store.chunk_storage = counter = CountingStorage(store.chunk_storage)
        reader = store.open_reader("scan")
        out = bytearray()
        while len(out) < SIZE:
            out += await reader.read(len(out), MiB)
        assert bytes(out) == payload
        await trio.sleep(0.1)
        stats = store.block_cache.statistics()
    blocks = blocks_read(counter.reads)
    assert len(blocks) == len(set(blocks)) == SIZE // MiB, "every block fetched exactly once"
    assert stats.fetched_bytes == SIZE
    assert stats.gets == len(counter.reads) < SIZE // MiB, "no fewer GETs than blocks"
    assert stats.run_gets >= 2 and max(end - start for _, start, end in counter.reads) >= 4 * MiB


async def test_a_random_4k_read_fetches_exactly_one_block(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    config = s3_config(tmp_path, *s3_bucket)
    async with open_store(config) as store:
        await write_segment(store, "random")
    async with open_store(config) as store:
        store.chunk_storage = counter = CountingStorage(store.chunk_storage)
        offset = 11 * MiB + 5 * 4096  # block 3 of the second chunk
        data = await store.open_reader("random").read(offset, 4096)
        assert len(data) == 4096
        await trio.sleep(0.2)  # read-ahead, if a random read started any, shows now
        stats = store.block_cache.statistics()
        assert [(start, end) for _, start, end in counter.reads] == [(3 * MiB, 4 * MiB)]
        assert stats.gets == 1 and stats.fetched_bytes == MiB and stats.run_gets == 0


async def test_a_corrupt_block_inside_a_run_fails_alone(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    url, options = s3_bucket
    config = s3_config(tmp_path, url, options)
    async with open_store(config) as store:
        payload = await write_segment(store, "bad")
        first = (await store.chunk_layout("bad"))[0]
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")
    key = f"{prefix}/{first['name']}"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[2 * MiB + 12345] ^= 0xFF  # block 2 of the first chunk
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    async with open_store(config) as store:
        store.chunk_storage = counter = CountingStorage(store.chunk_storage)
        assert await start_run(store, "bad", 0, 8 * MiB, run_blocks=8) == 8
        with trio.fail_after(10):  # the run's last block is in: every block before it was handed over
            while store.block_cache.peek((first["name"], 7, MiB)) is None:
                await trio.sleep(0.01)
        for block in range(8):
            if block == 2:
                with pytest.raises(DataCorruptionError, match=r"block 2 \(segment bytes 2097152\.\.") as raised:
                    await store.read("bad", block * MiB, MiB)
                assert "CRC32C" in str(raised.value)
            else:
                assert await store.read("bad", block * MiB, MiB) == payload[block * MiB : (block + 1) * MiB]
        # one GET for the run; block 2 asked again alone (and failing again), the rest cached
        assert [(start, end) for _, start, end in counter.reads] == [(0, 8 * MiB), (2 * MiB, 3 * MiB)]
        assert store.block_cache.peek((first["name"], 2, MiB)) is None
        assert store.block_cache.peek((first["name"], 3, MiB)) is not None


class SlowRuns(CountingStorage):
    """Counts reads; a run waits ``delay_s`` in its worker thread before its GET, so
    readers arrive while it is in flight."""

    def __init__(self, inner: ChunkStorage, delay_s: float) -> None:
        super().__init__(inner)
        self.delay_s = delay_s
        self.runs_started = threading.Event()

    def read_blocks(self, name: str, spans: Sequence[tuple[int, int]], on_block: Callable[[int, bytes], None]) -> None:
        self.runs_started.set()
        time.sleep(self.delay_s)
        super().read_blocks(name, spans, on_block)


async def test_readers_of_blocks_of_a_run_in_flight_share_it(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    config = s3_config(tmp_path, *s3_bucket)
    async with open_store(config) as store:
        payload = await write_segment(store, "shared")
    async with open_store(config) as store:
        store.chunk_storage = slow = SlowRuns(store.chunk_storage, delay_s=0.3)
        assert await start_run(store, "shared", 8 * MiB, 16 * MiB, run_blocks=8) == 8
        results: dict[int, bytes] = {}

        async def read_block(block: int) -> None:
            results[block] = await store.read("shared", block * MiB + 100, 1000)

        async with trio.open_nursery() as nursery:
            for block in range(8, 16):
                for _ in range(3):  # three readers per block
                    nursery.start_soon(read_block, block)
        assert slow.runs_started.is_set()
        for block in range(8, 16):
            assert results[block] == payload[block * MiB + 100 : block * MiB + 1100]
        assert [(start, end) for _, start, end in slow.reads] == [(0, 8 * MiB)], "one GET for all readers"
        stats = store.block_cache.statistics()
        assert stats.gets == 1 and stats.run_gets == 1 and stats.fetched_bytes == 8 * MiB


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint, seed=19) as running:
        yield running


async def test_a_stalled_run_is_hedged_and_the_read_completes(
    tmp_path: Path, proxy: FaultProxy, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    url, options = s3_bucket
    config = s3_config(tmp_path, url, {**options, "endpoint_url": proxy.url}, tier2_read_timeout_s=0.5)
    async with open_store(config) as store:
        payload = await write_segment(store, "stall")
    stall_s = 30.0
    # the run's GET and its twin each send half of what they were asked, then stall
    proxy.faults = Faults(stall_rate=1.0, stall_s=stall_s, methods=frozenset({"GET"}), max_faults=2,
                          path_contains="/s0")  # chunk objects only: not the owner claims
    async with open_store(config) as store:
        started_s = time.monotonic()
        assert await start_run(store, "stall", 0, 8 * MiB, run_blocks=8) == 8
        data = await store.read("stall", 0, 8 * MiB)
        waited_s = time.monotonic() - started_s
        stats = store.block_cache.statistics()
    assert data == payload[: 8 * MiB]
    assert proxy.counters.stalls == 2
    assert waited_s < stall_s / 3, f"the read waited {waited_s:.1f} s: the stall was waited out"
    assert stats.gets == 1 and stats.fetched_bytes == 8 * MiB  # the run brought every block


async def test_a_run_of_an_offloaded_chunk_is_one_get_checked_against_its_index(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    url, options = s3_bucket
    config = small_config(
        tmp_path / "data", offload_url=url.rsplit("/", 1)[0] + "/longterm", offload_options=options,
        offload_deletion_lag_s=0.0, policy_interval_s=3600.0, max_chunk_bytes=4 * MiB,
        max_flush_bytes=4 * MiB, flush_bytes=1 << 30, flush_interval_s=3600,
        block_cache_bytes=64 * MiB,
    )
    async with open_store(config) as store:
        payload = await write_segment(store, "cold", 8 * MiB)
        await store.seal("cold")
        await store.offload("cold")
        with trio.fail_after(60):
            while (await store.offload_status("cold"))["state"] == "RUNNING":
                await trio.sleep(0.02)
        layout = await store.chunk_layout("cold")
        assert all(entry["offloaded"] for entry in layout) and layout[0]["end"] == 4 * MiB
        store.block_cache.clear()
        gets_before = store.block_cache.gets
        assert await start_run(store, "cold", 0, 4 * MiB, run_blocks=4) == 4
        assert await store.read("cold", 0, 4 * MiB) == payload[: 4 * MiB]
        assert store.block_cache.gets - gets_before == 1, "one ranged GET for the four blocks"
        assert store.block_cache.run_gets == 1
