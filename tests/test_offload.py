"""Offload to a long-term S3 store (moto server on 127.0.0.1), in-process engine:
the attempt protocol's results, reads from offloaded chunks, deletion lag, damaged
objects, policies on a test clock, retention, garbage collection."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import (
    ChunkMissingError,
    DataCorruptionError,
    InvalidArgumentError,
    NotADirectoryError_,
    OffloadRunningError,
    TruncatedError,
)
from tierfs.contracts.policy import Policy, parse_assignments
from tierfs.engine.object_keys import OffloadKeys
from tierfs.offload.offload_format import FORMAT_METADATA_KEY, decode_index
from tierfs.offload.planning import ChunkFacts, chunks_to_offload, head_chunks_to_expire
from tierfs.store.facade import SegmentStore
from tierfs.store.fsck import fsck
from tierfs.testing.harness import small_config

KiB = 1 << 10
PAYLOAD = os.urandom(1100 * KiB)  # 5 chunks of at most 256 KiB under small_config


class TestClock:
    """Wall-clock time plus a skew the test moves forward."""

    __test__ = False

    def __init__(self) -> None:
        self.skew_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew_s


@pytest.fixture
def long_term(s3_bucket: tuple[str, dict[str, object]]) -> tuple[str, dict[str, object], str]:
    url, options = s3_bucket
    bucket = url.split("/")[2]
    return f"s3://{bucket}/longterm", options, bucket


def _s3(options: dict[str, Any]) -> Any:
    return boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")


def _keys(options: dict[str, Any], bucket: str, prefix: str = "longterm/") -> list[str]:
    listed = _s3(options).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


@pytest.fixture
async def ostore(tmp_path: Path, long_term: tuple[str, dict[str, object], str]) -> AsyncIterator[SegmentStore]:
    url, options, _ = long_term
    config = small_config(tmp_path / "data", offload_url=url, offload_options=options,
                          offload_deletion_lag_s=0.0, policy_interval_s=3600.0)
    async with open_store(config) as store:
        store.clock = TestClock()
        yield store


async def _write(store: SegmentStore, name: str, data: bytes = PAYLOAD, *, seal: bool = True) -> None:
    await store.create(name, make_parents=True)
    for start in range(0, len(data), 32 * KiB):
        await store.append(name, data[start : start + 32 * KiB])
    await store.flush(name)
    if seal:
        await store.seal(name)
        await store.flush(name)


async def _wait_done(store: SegmentStore, name: str) -> dict[str, Any]:
    with trio.fail_after(60):
        while True:
            status = await store.offload_status(name)
            if status["state"] != "RUNNING":
                return status
            await trio.sleep(0.02)


async def test_offload_then_read_identical_bytes(ostore: SegmentStore, long_term: Any) -> None:
    _, options, bucket = long_term
    await _write(ostore, "logs/a")
    assert (await ostore.offload_status("logs/a"))["state"] == "NOT_RUN"
    started = await ostore.offload("logs/a")
    assert started["state"] == "RUNNING" and started["bytes_total"] == len(PAYLOAD)
    status = await _wait_done(ostore, "logs/a")
    assert status["state"] == "SUCCESS", status
    assert status["bytes_done"] == status["offloaded_bytes"] == status["sealed_bytes"] == len(PAYLOAD)

    seg = ostore._segment("logs/a")
    chunks = await ostore.chunks_of(seg)
    assert len(chunks) >= 4
    s3 = _s3(options)
    for chunk in chunks:
        assert chunk.offload_complete and chunk.offload_hot_deleted and chunk.location
        assert not (ostore.config.data_dir / "chunks" / chunk.name).exists()  # lag 0
        keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)
        assert chunk.location.endswith(keys.data) and f"s{seg.segment_id:08d}/" in keys.data
        data_object = s3.get_object(Bucket=bucket, Key="longterm/" + keys.data)
        assert data_object["Metadata"][FORMAT_METADATA_KEY] == "1"
        start = int(chunk.start_offset)
        assert data_object["Body"].read() == PAYLOAD[start : start + chunk.length]
        index_object = s3.get_object(Bucket=bucket, Key="longterm/" + keys.index)
        assert index_object["Metadata"][FORMAT_METADATA_KEY] == "1"
        index = decode_index(index_object["Body"].read(), chunk, keys.index)
        assert index.segment_name == "logs/a" and index.software_version
    assert len(_keys(options, bucket)) == 2 * len(chunks)

    ostore.block_cache.clear()
    gets_before = ostore.block_cache.gets
    assert await ostore.read("logs/a") == PAYLOAD
    assert ostore.block_cache.gets - gets_before == sum((c.length + KiB * KiB - 1) // (KiB * KiB) for c in chunks)
    assert await ostore.read("logs/a", 300 * KiB, 5000) == PAYLOAD[300 * KiB : 300 * KiB + 5000]
    layout = await ostore.chunk_layout("logs/a")
    assert all(entry["offloaded"] and entry["url"].startswith("s3://") for entry in layout)
    report = await fsck(ostore)
    assert report.problems == [] and report.bytes_checked == len(PAYLOAD)
    reads, ostore.long_term_reads = ostore.long_term_reads, None  # as if started without --offload-to
    with pytest.raises(InvalidArgumentError, match="run fsck with --offload-to"):  # no damage reported
        await fsck(ostore)
    ostore.long_term_reads = reads
    stats = ostore.statistics()
    assert stats.offloaded_bytes == len(PAYLOAD) and stats.hot_copies_deleted == len(chunks)


async def test_up_to_only_sealed_chunks_and_already_running(ostore: SegmentStore) -> None:
    await _write(ostore, "u", seal=False)  # not sealed: the last chunk can still grow
    seg = ostore._segment("u")
    chunks = await ostore.chunks_of(seg)
    second_end = int(chunks[1].start_offset + chunks[1].length)
    started = await ostore.offload("u", up_to=second_end)
    assert started["chunks_total"] == 2
    with pytest.raises(OffloadRunningError, match="already running"):
        await ostore.offload("u")
    assert (await _wait_done(ostore, "u"))["state"] == "SUCCESS"
    assert [bool(c.offload_complete) for c in seg.chunks or []][:3] == [True, True, False]
    await ostore.offload("u")
    status = await _wait_done(ostore, "u")
    assert [bool(c.offload_complete) for c in seg.chunks or []][-1] is False  # never the growing chunk
    assert status["offloaded_bytes"] == status["sealed_bytes"] < len(PAYLOAD)
    # the segment keeps growing normally after its head was offloaded
    await ostore.append("u", b"more")
    await ostore.flush("u")
    assert await ostore.read("u") == PAYLOAD + b"more"
    with pytest.raises(InvalidArgumentError):
        await ostore.offload("u", up_to=-1)


async def test_deletion_lag_keeps_the_hot_copy_until_due(tmp_path: Path, long_term: Any) -> None:
    url, options, _ = long_term
    config = small_config(tmp_path / "data", offload_url=url, offload_options=options,
                          offload_deletion_lag_s=3600.0, policy_interval_s=3600.0)
    async with open_store(config) as store:
        clock = TestClock()
        store.clock = clock
        await _write(store, "lag")
        await store.offload("lag")
        assert (await _wait_done(store, "lag"))["state"] == "SUCCESS"
        chunks = store._segment("lag").chunks or []
        hot = [config.data_dir / "chunks" / c.name for c in chunks]
        assert all(p.exists() for p in hot)
        assert all(c.offload_complete and not c.offload_hot_deleted for c in chunks)
        store.block_cache.clear()
        assert await store.read("lag") == PAYLOAD  # from the long-term copy already
        clock.skew_s = 3540.0  # a minute before due: room for a slow machine between offload and scan
        await store.scheduler.scan()
        assert all(p.exists() for p in hot)
        clock.skew_s = 3601.0
        await store.scheduler.scan()
        assert not any(p.exists() for p in hot)
        assert all(c.offload_hot_deleted for c in store._segment("lag").chunks or [])
        store.block_cache.clear()
        assert await store.read("lag") == PAYLOAD


async def test_missing_or_damaged_objects_fail_clearly(ostore: SegmentStore, long_term: Any) -> None:
    _, options, bucket = long_term
    await _write(ostore, "d")
    await ostore.offload("d")
    await _wait_done(ostore, "d")
    chunks = ostore._segment("d").chunks or []
    s3 = _s3(options)
    first, second, third = (OffloadKeys.for_attempt(c.name, c.offload_attempt_uuid) for c in chunks[:3])
    # a data object whose bytes changed (same length)
    original = s3.get_object(Bucket=bucket, Key="longterm/" + first.data)["Body"].read()
    s3.put_object(Bucket=bucket, Key="longterm/" + first.data, Body=b"X" + original[1:])
    # a missing data object
    s3.delete_object(Bucket=bucket, Key="longterm/" + second.data)
    # an index object that does not describe the chunk
    s3.put_object(Bucket=bucket, Key="longterm/" + third.index, Body=b"\x08\x01garbage")
    ostore.block_cache.clear()
    with pytest.raises(DataCorruptionError, match="CRC32C"):
        await ostore.read("d", 0, 10)
    with pytest.raises(ChunkMissingError, match="long-term store"):
        await ostore.read("d", int(chunks[1].start_offset), 10)
    with pytest.raises(DataCorruptionError, match="offload index"):
        await ostore.read("d", int(chunks[2].start_offset), 10)
    start = int(chunks[3].start_offset)
    assert await ostore.read("d", start, 10) == PAYLOAD[start : start + 10]  # the rest still reads
    report = await fsck(ostore)
    assert {p.chunk for p in report.problems} == {c.name for c in chunks[:3]}


async def test_delete_segment_collects_long_term_objects(ostore: SegmentStore, long_term: Any) -> None:
    _, options, bucket = long_term
    await _write(ostore, "gone")
    await ostore.offload("gone")
    await _wait_done(ostore, "gone")
    assert _keys(options, bucket)
    await ostore.delete("gone")
    with trio.fail_after(10):
        while _keys(options, bucket):
            await trio.sleep(0.05)


async def test_offload_without_long_term_store_is_a_clear_error(store: SegmentStore) -> None:
    await _write(store, "x")
    with pytest.raises(InvalidArgumentError, match="--offload-to"):
        await store.offload("x")


# ---------------------------------------------------------------------------- policies
def test_policy_parsing_and_thresholds() -> None:
    assert parse_assignments(["offload_after_s=60", "retention_bytes=none"]) == {
        "offload_after_s": 60, "retention_bytes": None}
    for bad in (["offload_after=1"], ["retention_s"], ["retention_s=-1"], ["retention_s=1.5"]):
        with pytest.raises(InvalidArgumentError):
            parse_assignments(bad)
    with pytest.raises(InvalidArgumentError, match="at or above"):
        Policy(offload_after_s=100, retention_s=100).check("d")
    with pytest.raises(InvalidArgumentError, match="at or above"):
        Policy(offload_hot_bytes=5, retention_bytes=4).check("d")
    Policy(offload_after_s=99, retention_s=100, offload_hot_bytes=1, retention_bytes=2).check("d")


def test_planners_choose_only_sealed_chunks() -> None:
    chunks = [ChunkFacts(0, 100, 1000.0, False), ChunkFacts(100, 100, 2000.0, False),
              ChunkFacts(200, 100, 3000.0, True), ChunkFacts(300, 50, None, False)]
    assert chunks_to_offload(chunks, Policy(offload_after_s=1500), 3600.0, 350) == [0, 100]
    assert chunks_to_offload(chunks, Policy(offload_after_s=0), 3600.0, 350) == [0, 100]
    # 250 hot bytes (350 minus 100 offloaded); the growing chunk never moves
    assert chunks_to_offload(chunks, Policy(offload_hot_bytes=200), 0.0, 350) == [0]
    assert chunks_to_offload(chunks, Policy(offload_hot_bytes=0), 0.0, 350) == [0, 100]
    assert head_chunks_to_expire(chunks, Policy(retention_s=1500), 3600.0, 350) == 2
    assert head_chunks_to_expire(chunks, Policy(retention_s=10_000), 3600.0, 350) == 0
    # keeps at least 150 bytes: deleting 0..200 leaves 150, deleting 200..300 would leave 50
    assert head_chunks_to_expire(chunks, Policy(retention_bytes=150), 0.0, 350) == 2
    assert head_chunks_to_expire(chunks, Policy(retention_bytes=0), 0.0, 350) == 3


async def test_policies_inherit_and_reject_bad_combinations(ostore: SegmentStore) -> None:
    await ostore.mkdir("a/b", parents=True)
    await ostore.create("a/b/seg")
    await ostore.set_policy("", {"retention_s": 7200})
    await ostore.set_policy("a", {"offload_after_s": 60})
    result = await ostore.set_policy("a/b", {"offload_hot_bytes": 1000})
    assert result["set"] == {"offload_hot_bytes": 1000}
    assert result["effective"] == {
        "retention_s": {"value": 7200, "from": ""},
        "offload_after_s": {"value": 60, "from": "a"},
        "offload_hot_bytes": {"value": 1000, "from": "a/b"},
    }
    assert (await ostore.get_policy("a/b/seg"))["effective"]["offload_after_s"]["from"] == "a"
    with pytest.raises(InvalidArgumentError, match="at or above"):
        await ostore.set_policy("a/b", {"retention_s": 60})
    with pytest.raises(InvalidArgumentError, match="at or above"):
        await ostore.set_policy("", {"retention_s": 60})  # a/ below would break
    assert (await ostore.get_policy("a/b"))["set"] == {"offload_hot_bytes": 1000}  # unchanged
    with pytest.raises(NotADirectoryError_):
        await ostore.set_policy("a/b/seg", {"retention_s": 1})
    await ostore.set_policy("a", {"offload_after_s": None})
    assert "offload_after_s" not in (await ostore.get_policy("a/b"))["effective"]


async def test_policy_offloads_on_time_and_on_size(ostore: SegmentStore) -> None:
    clock = ostore.clock
    assert isinstance(clock, TestClock)
    await _write(ostore, "t/seg")
    await _write(ostore, "s/seg", seal=False)
    await ostore.set_policy("t", {"offload_after_s": 600})
    await ostore.scheduler.scan()
    assert (await ostore.offload_status("t/seg"))["state"] == "NOT_RUN"  # sealed for < 600 s
    assert ostore.statistics().offload_oldest_waiting_s == 0
    clock.skew_s = 601
    await ostore.scheduler.scan()
    status = await _wait_done(ostore, "t/seg")
    assert status["state"] == "SUCCESS" and status["trigger"] == "policy"
    assert status["offloaded_bytes"] == len(PAYLOAD)

    await ostore.set_policy("s", {"offload_hot_bytes": 600 * KiB})
    await ostore.scheduler.scan()
    status = await _wait_done(ostore, "s/seg")
    hot = len(PAYLOAD) - status["offloaded_bytes"]
    assert status["state"] == "SUCCESS" and 0 < hot <= 600 * KiB
    chunks = ostore._segment("s/seg").chunks or []
    offloaded = [bool(c.offload_complete) for c in chunks]
    assert offloaded == sorted(offloaded, reverse=True)  # the oldest go first
    assert await ostore.read("s/seg") == PAYLOAD


async def test_retention_deletes_only_whole_expired_chunks(ostore: SegmentStore) -> None:
    clock = ostore.clock
    assert isinstance(clock, TestClock)
    await _write(ostore, "r/seg", seal=False)
    seg = ostore._segment("r/seg")
    chunks = list(await ostore.chunks_of(seg))
    chunk_dir = ostore.config.data_dir / "chunks"
    await ostore.set_policy("r", {"retention_bytes": 700 * KiB})
    await ostore.scheduler.scan()
    kept = seg.chunks or []
    deleted = chunks[: len(chunks) - len(kept)]
    assert deleted and kept[0].start_offset == seg.start_offset
    assert len(PAYLOAD) - seg.start_offset >= 700 * KiB
    assert len(PAYLOAD) - (seg.start_offset - deleted[-1].length) >= 700 * KiB  # whole chunks only
    assert await ostore.read("r/seg", seg.start_offset) == PAYLOAD[seg.start_offset :]
    with pytest.raises(TruncatedError, match="retention"):
        await ostore.read("r/seg", 0, 10)
    info = await ostore.stat("r/seg")
    assert info.start_offset == seg.start_offset and info.length == len(PAYLOAD)  # type: ignore[union-attr]
    with trio.fail_after(10):
        while any((chunk_dir / c.name).exists() for c in deleted):
            await trio.sleep(0.02)
    assert (await fsck(ostore)).problems == []

    await ostore.set_policy("r", {"retention_bytes": None, "retention_s": 3600})
    await ostore.scheduler.scan()
    assert seg.chunks == kept  # nothing sealed an hour ago
    clock.skew_s = 3601
    await ostore.scheduler.scan()
    remaining = seg.chunks or []
    assert len(remaining) == 1 and remaining[0] is kept[-1]  # the growing chunk stays
    assert await ostore.read("r/seg", seg.start_offset) == PAYLOAD[seg.start_offset :]
    await ostore.append("r/seg", b"tail")
    assert (await ostore.read("r/seg", len(PAYLOAD))) == b"tail"


async def test_concat_of_an_offloaded_segment_keeps_reading_it(ostore: SegmentStore) -> None:
    await _write(ostore, "tx/part")
    await ostore.offload("tx/part")
    assert (await _wait_done(ostore, "tx/part"))["state"] == "SUCCESS"
    await ostore.create("result")
    await ostore.append("result", b"head")
    await ostore.concat("result", "tx/part")
    ostore.block_cache.clear()
    assert await ostore.read("result") == b"head" + PAYLOAD
    assert (await fsck(ostore)).problems == []
