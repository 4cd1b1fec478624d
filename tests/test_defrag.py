"""Defrag: runs of small adjacent chunks become large ones, natively where tier-2 can,
with a verified copy and one conditional metadata swap (engine/upkeep/defrag.py)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import (
    ChunkMissingError,
    ConcurrentModificationError,
    DaemonUnavailableError,
    MetadataUnavailableError,
)
from tierfs.engine.record_types import Chunk
from tierfs.engine.tier2.chunk_storage import ChunkStorage, open_chunk_storage
from tierfs.engine.tier2.s3_merge import MIN_PART_BYTES, MergeCounts, plan_parts
from tierfs.engine.upkeep.defrag_plan import merge_runs
from tierfs.store.facade import SegmentStore
from tierfs.testing.crash import DEFRAG_CRASH_POINTS, crash_environment, wait_for_crash
from tierfs.testing.harness import small_config, start_daemon
from tierfs.testing.storages import WrappedStorage

KiB = 1 << 10
MiB = 1 << 20
CHUNK_NAME = re.compile(r"s\d{8}/e\d{6}-c\d{8}")


class OneObjectPerFlush(WrappedStorage):
    """Local tier-2 that never appends, as an object store: every flush is a new chunk.
    Its merges still go to the local storage (copy_file_range)."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.supports_append = False


class SlowReads(OneObjectPerFlush):
    """Reads take a while, so reads holding the old chunk list are in flight while the
    swap and the collection of the old objects happen."""

    def read(self, name: str, start: int, end: int) -> bytes:
        time.sleep(0.02)
        return super().read(name, start, end)


class ReadsAfterDeletion(OneObjectPerFlush):
    """Reads of the objects in ``hold`` wait until the object was deleted: a read that
    resolved the old chunk list before the swap reaches tier-2 only after the GC."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.hold: set[str] = set()
        self.deleted: set[str] = set()
        self.missed = 0
        self._changed = threading.Condition()

    def read(self, name: str, start: int, end: int) -> bytes:
        if name in self.hold:
            with self._changed:
                self._changed.wait_for(lambda: name in self.deleted, timeout=10)
        try:
            return super().read(name, start, end)
        except ChunkMissingError:
            self.missed += 1
            raise

    def delete(self, name: str) -> None:
        super().delete(name)
        with self._changed:
            self.deleted.add(name)
            self._changed.notify_all()


class SlowMerge(OneObjectPerFlush):
    """Merges take a while, so the segment can change while one runs."""

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        time.sleep(0.3)
        return super().merge(name, pieces)


async def _slow_segment(store: SegmentStore, name: str, flushes: int, rng: random.Random) -> bytes:
    """A segment flushed after every small append: one chunk per flush."""
    await store.create(name, make_parents=True)
    expected = bytearray()
    for _ in range(flushes):
        record = rng.randbytes(rng.randrange(1, 40 * KiB))
        await store.append(name, record)
        await store.flush(name)
        expected += record
    return bytes(expected)


def _config(tmp_path: Path, **overrides: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = {"offload_deletion_lag_s": 0, "max_chunk_bytes": 2 * MiB, **overrides}
    return small_config(tmp_path / "d", **values)


async def test_defrag_merges_a_slow_segment_and_every_byte_reads_back(tmp_path: Path) -> None:
    rng = random.Random(1)
    async with open_store(_config(tmp_path)) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        expected = await _slow_segment(store, "logs/slow", 80, rng)
        before = await store.chunk_layout("logs/slow")
        assert len(before) == 80
        result = await store.defrag("logs/slow")
        after = await store.chunk_layout("logs/slow")
        assert result["chunks_before"] == 80 and result["chunks_after"] == len(after)
        # 79 chunks (all but the growing last one), ~1.6 MiB: one or two merged chunks
        assert len(after) <= 3 and result["chunks_merged"] == 79
        assert result["copied_natively_bytes"] == sum(c["end"] - c["start"] for c in before[:-1])
        assert result["rewritten_bytes"] == 0
        assert await store.read("logs/slow") == expected
        merged = [c for c in after if c["name"] not in {b["name"] for b in before}]
        assert merged and all(CHUNK_NAME.fullmatch(c["name"]) for c in merged)
        assert any(len(c["block_crc32c"]) > 1 for c in merged), "merged chunks have 1 MiB blocks"
        stat = await store.stat("logs/slow")
        assert stat.chunk_count == len(after)  # type: ignore[union-attr]
        assert (await store.fsck()).problems == []
        await store.garbage.collect()
        objects = set(store.chunk_storage.list())
        assert objects == {c["name"] for c in after}, "merged-away objects are collected"
        # sealed and fully flushed: the last chunk joins too
        await store.seal("logs/slow")
        await store.flush("logs/slow")
        await store.defrag("logs/slow")
        assert len(await store.chunk_layout("logs/slow")) == 1
        assert await store.read("logs/slow") == expected
    async with open_store(_config(tmp_path)) as store:  # the swap is in the metadata
        assert await store.read("logs/slow") == expected
        assert (await store.fsck()).problems == []


async def test_a_reader_during_defrag_never_sees_a_gap(tmp_path: Path) -> None:
    rng = random.Random(2)
    config = _config(tmp_path, block_cache_bytes=MiB, max_chunk_bytes=128 * KiB)
    async with open_store(config) as store:
        store.chunk_storage = SlowReads(store.chunk_storage)
        expected = await _slow_segment(store, "s", 60, rng)
        reads = 0
        done = False

        async def keep_reading() -> None:
            nonlocal reads
            while not done:
                store.block_cache.clear()  # every read goes to tier-2, racing the swap and GC
                start = rng.randrange(len(expected))
                assert await store.read("s", start, 100 * KiB) == expected[start : start + 100 * KiB]
                reads += 1

        async with trio.open_nursery() as nursery:
            for _ in range(2):  # their block reads leave tier-2 slots free for the GC's deletes
                nursery.start_soon(keep_reading)
            await trio.sleep(0.05)
            result = await store.defrag("s")
            await trio.sleep(0.1)
            done = True
        assert result["runs_merged"] >= 5 and reads > 20
        assert await store.read("s") == expected


async def test_a_read_holding_the_old_chunk_list_resolves_again(tmp_path: Path) -> None:
    rng = random.Random(7)
    async with open_store(_config(tmp_path)) as store:
        storage = ReadsAfterDeletion(store.chunk_storage)
        store.chunk_storage = storage
        expected = await _slow_segment(store, "s", 20, rng)
        layout = await store.chunk_layout("s")
        storage.hold = {c["name"] for c in layout[:3]}
        store.block_cache.clear()
        async with trio.open_nursery() as nursery:
            read_back: list[bytes] = []

            async def read_head() -> None:
                read_back.append(await store.read("s", 0, layout[2]["end"]))

            nursery.start_soon(read_head)
            await trio.sleep(0.05)  # the read resolved the old list; its block reads wait
            result = await store.defrag("s")
        assert result["runs_merged"] == 1
        assert storage.missed >= 1, "the read reached tier-2 after the old objects were deleted"
        assert read_back == [expected[: layout[2]["end"]]]


async def test_appends_and_flushes_during_defrag_are_safe(tmp_path: Path) -> None:
    rng = random.Random(3)
    async with open_store(_config(tmp_path)) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        expected = bytearray(await _slow_segment(store, "s", 40, rng))
        stop = False

        async def keep_appending() -> None:
            while not stop:
                record = rng.randbytes(rng.randrange(1, 8 * KiB))
                await store.append("s", record)
                expected.extend(record)
                await store.flush("s")

        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_appending)
            for _ in range(4):
                results.append(await store.defrag("s"))
            stop = True
        await store.flush("s")
        assert sum(r["runs_merged"] for r in results) >= 1
        layout = await store.chunk_layout("s")
        assert len({c["name"] for c in layout}) == len(layout), "no two chunks share an object"
        assert all(a["end"] == b["start"] for a, b in zip(layout, layout[1:], strict=False))
        assert await store.read("s") == bytes(expected)
        assert (await store.fsck()).problems == []


@pytest.mark.parametrize("change", ["offload attempt", "rm"])
async def test_a_run_that_changed_during_its_merge_is_skipped(tmp_path: Path, change: str) -> None:
    rng = random.Random(8)
    async with open_store(_config(tmp_path)) as store:
        store.chunk_storage = SlowMerge(store.chunk_storage)
        expected = await _slow_segment(store, "s", 10, rng)
        seg = store.table.segment("s")
        before = list(await store.chunks_of(seg))
        async with trio.open_nursery() as nursery:
            results = []

            async def defrag() -> None:
                results.append(await store.defrag("s"))

            nursery.start_soon(defrag)
            await trio.sleep(0.1)  # the merge is running
            if change == "rm":
                await store.delete("s")
            else:  # what the offloader records before it uploads anything
                async with seg.meta_lock:
                    attempt = dataclasses.replace(before[4], offload_attempt_uuid=str(uuid.uuid4()))
                    await store.catalogue.commit_chunk(seg, attempt)
        assert results[0]["runs_skipped"] == 1 and results[0]["runs_merged"] == 0
        await store.garbage.collect()
        if change == "rm":
            assert store.chunk_storage.list() == [], "the merged object is collected too"
        else:
            assert [c.name for c in await store.chunks_of(seg)] == [c.name for c in before]
            assert set(store.chunk_storage.list()) == {c.name for c in before}
            assert await store.read("s") == expected
            assert (await store.fsck()).problems == []


async def test_the_swap_is_refused_when_an_old_chunk_changed(tmp_path: Path) -> None:
    rng = random.Random(4)
    async with open_store(_config(tmp_path)) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        expected = await _slow_segment(store, "s", 4, rng)
        seg = store.table.segment("s")
        chunks = await store.chunks_of(seg)
        stale = dataclasses.replace(chunks[1], offload_attempt_uuid="00000000-0000-0000-0000-000000000000")
        merged = Chunk(name="s00000001/e000001-c00000099", segment_id=seg.segment_id,
                       length=chunks[0].length + chunks[1].length)
        with pytest.raises(ConcurrentModificationError):
            store.metadata.replace_chunks(seg.row, seg.record, [chunks[0], stale], merged, 0)
        assert store.metadata.load_chunks(seg.segment_id) == chunks
        assert store.metadata.garbage() == []
        assert await store.read("s") == expected


def test_planning_keeps_offloaded_chunks_and_the_last_one() -> None:
    def chunk(start: int, length: int, **fields: object) -> Chunk:
        return Chunk(name=f"c{start}", start_offset=start, length=length, **fields)  # type: ignore[arg-type]

    chunks = [chunk(0, 10), chunk(10, 10), chunk(20, 10, location="s3://x"), chunk(30, 10),
              chunk(40, 10), chunk(50, 100), chunk(150, 10), chunk(160, 10)]
    assert merge_runs(chunks, 50, 1000, include_last=False) == [(0, 2), (3, 5)]
    assert merge_runs(chunks, 50, 1000, include_last=True) == [(0, 2), (3, 5), (6, 8)]
    assert merge_runs(chunks, 50, 25, include_last=False) == [(0, 2), (3, 5)]
    assert merge_runs(chunks, 50, 15, include_last=False) == []


def test_s3_parts_are_at_least_five_mib_except_the_last() -> None:
    big, small = MIN_PART_BYTES, 100 * KiB
    parts = plan_parts([("a", small), ("b", big), ("c", big), ("d", small), ("e", small)])
    assert [(p.copy, [s for s, _ in p.sources]) for p in parts] == [
        (False, ["a", "b"]), (True, ["c"]), (False, ["d", "e"])]
    assert all(p.length >= MIN_PART_BYTES for p in parts[:-1])


async def test_defrag_on_s3_copies_big_chunks_inside_s3(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = s3_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options, offload_deletion_lag_s=0,
                          max_chunk_bytes=32 * MiB, max_flush_bytes=16 * MiB, flush_bytes=16 * MiB)
    rng = random.Random(5)
    sizes = [100 * KiB, 200 * KiB, 6 * MiB, 6 * MiB, 300 * KiB, 50 * KiB, 10 * KiB]
    expected = bytearray()
    async with open_store(config) as store:
        assert store.chunk_storage.supports_native_merge
        await store.create("s")
        for size in sizes:
            record = rng.randbytes(size)
            await store.append("s", record)
            await store.flush("s")
            expected += record
        before = await store.chunk_layout("s")
        assert [c["end"] - c["start"] for c in before] == sizes
        result = await store.defrag("s")
        # parts: (100 KiB + 200 KiB + 6 MiB) uploaded, 6 MiB copied inside S3, 350 KiB uploaded
        assert result["copied_natively_bytes"] == 6 * MiB
        assert result["rewritten_bytes"] == sum(sizes[:-1]) - 6 * MiB
        assert result["chunks_after"] == 2
        assert await store.read("s") == bytes(expected)
        assert (await store.fsck()).problems == []
        await store.garbage.collect()
        layout = await store.chunk_layout("s")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    client = boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    # the owner claims and metadata backups live beside the chunks; defrag never touches them
    keys = {k for k in (o["Key"].removeprefix(prefix).lstrip("/") for o in listed) if not k.startswith("_")}
    assert keys == {c["name"] for c in layout}
    async with open_store(config) as store:
        assert await store.read("s") == bytes(expected)


async def test_the_background_pass_merges_segments_with_many_small_chunks(tmp_path: Path) -> None:
    rng = random.Random(6)
    config = _config(tmp_path, defrag_interval_s=3600, defrag_small_chunk_bytes=64 * KiB,
                     defrag_min_small_chunks=10)
    async with open_store(config) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        few = await _slow_segment(store, "few", 8, rng)  # not above the threshold: left alone
        many = await _slow_segment(store, "many", 30, rng)
        store.defragmenter.wake()
        with trio.fail_after(10):
            while len(await store.chunk_layout("many")) > 3:
                await trio.sleep(0.02)
        assert len(await store.chunk_layout("few")) == 8
        assert await store.read("many") == many and await store.read("few") == few


def _tierfs(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_tierfs_defrag_in_process_and_through_the_daemon(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert _tierfs(data_dir, "create", "log").returncode == 0
    expected = b""
    for run in range(6):  # each owner epoch starts a new chunk on local tier-2
        line = f"run {run}\n"
        assert _tierfs(data_dir, "append", "log", line).returncode == 0
        expected += line.encode()
    done = _tierfs(data_dir, "defrag", "log", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["chunks_before"] == 6 and result["chunks_after"] == 2
    daemon = start_daemon(data_dir)
    try:
        client = daemon.client()
        client.append("log", b"more\n")
        client.op("seal", path="log")
        client.op("flush", path="log")
        done = _tierfs(data_dir, "defrag", "log")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("log: 3 -> 1 chunks"), done.stdout
        assert client.read("log") == expected + b"more\n"
    finally:
        daemon.stop()
    assert _tierfs(data_dir, "fsck").returncode == 0


@pytest.mark.parametrize("point", DEFRAG_CRASH_POINTS)
async def test_kill_9_during_defrag_loses_nothing(tmp_path: Path, point: str) -> None:
    rng = random.Random(9)
    config = _config(tmp_path)
    async with open_store(config) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        expected = await _slow_segment(store, "s", 10, rng)
        await store.seal("s")
        before = [c["name"] for c in await store.chunk_layout("s")]
    daemon = start_daemon(config.data_dir, env={"TIERFS_OFFLOAD_DELETION_LAG_S": "0", **crash_environment(point)})
    client = daemon.client()
    with pytest.raises(DaemonUnavailableError):
        client.op("defrag", path="s")
    code, stderr = wait_for_crash(daemon, timeout_s=60)
    client.close()
    assert code == -signal.SIGKILL and f"crash point {point} reached" in stderr, stderr[-2000:]
    async with open_store(config) as store:
        assert await store.read("s") == expected
        assert (await store.fsck()).problems == []
        layout = [c["name"] for c in await store.chunk_layout("s")]
        await store.garbage.collect()
        objects = set(store.chunk_storage.list())
        if point == "defrag.merged":  # the merged object is not referenced; nothing changed
            assert layout == before and len(objects - set(before)) == 1
            orphan = (objects - set(before)).pop()
            await store.defrag("s")
            assert [c["name"] for c in await store.chunk_layout("s")] != [orphan]
        else:  # swapped: the old objects were queued with the swap, collected now
            assert len(layout) == 1 and objects == set(layout)
        assert await store.read("s") == expected


async def test_old_objects_wait_for_the_deletion_lag(tmp_path: Path) -> None:
    rng = random.Random(10)
    async with open_store(_config(tmp_path, offload_deletion_lag_s=0.5)) as store:
        store.chunk_storage = OneObjectPerFlush(store.chunk_storage)
        expected = await _slow_segment(store, "s", 10, rng)
        old = {c["name"] for c in await store.chunk_layout("s")}
        await store.defrag("s")
        await store.garbage.collect()
        assert old <= set(store.chunk_storage.list()), "kept for readers that hold the old list"
        with trio.fail_after(10):  # the defragmenter wakes the collector after the lag
            while old & set(store.chunk_storage.list()) != {sorted(old)[-1]}:
                await trio.sleep(0.05)
        assert await store.read("s") == expected


def test_local_merge_copies_through_user_space_where_the_kernel_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = open_chunk_storage(str(tmp_path / "chunks"))
    storage.write("s1/e1-c1", 0, b"a" * 3000 + b"tail beyond the committed length")
    storage.write("s1/e1-c2", 0, b"b" * (3 * MiB))

    def refuse(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device copy")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    counts = storage.merge("s1/e2-c3", [("s1/e1-c1", 3000), ("s1/e1-c2", 3 * MiB)])
    assert storage.read("s1/e2-c3", 0, 4 * MiB) == b"a" * 3000 + b"b" * (3 * MiB)
    assert (counts.copied_natively_bytes, counts.rewritten_bytes) == (0, 3000 + 3 * MiB)


class MergeThatWaits(OneObjectPerFlush):
    """A merge that writes its object, then waits until the test lets it finish."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.written = threading.Event()
        self.go_on = threading.Event()

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        counts = super().merge(name, pieces)
        self.written.set()
        assert self.go_on.wait(30)
        return counts


async def test_an_orphan_sweep_at_grace_zero_never_deletes_a_merge_before_its_swap(tmp_path: Path) -> None:
    """Path 4 of the data-safety issue: defrag takes its sequence number first, so its
    merged object sits below next_chunk_seq, unreferenced, until the swap commits; a
    sweep at grace 0 deleted exactly that (chunk_missing, fsck exit 3)."""
    rng = random.Random(4)
    async with open_store(_config(tmp_path, orphan_grace_s=0, orphan_gc_interval_s=0)) as store:
        storage = MergeThatWaits(store.chunk_storage)
        store.chunk_storage = storage
        expected = await _slow_segment(store, "logs/slow", 12, rng)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.defrag, "logs/slow")
            await trio.to_thread.run_sync(storage.written.wait, 30)
            report = await store.orphans.sweep(dry_run=False)
            assert report.orphans == [] and report.kept_in_flight >= 1
            storage.go_on.set()
        await store.garbage.collect()
        assert await store.read("logs/slow") == expected
        assert (await store.fsck()).problems == []


async def test_a_metadata_outage_during_a_background_pass_stops_the_pass_not_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_store(small_config(tmp_path / "d", defrag_interval_s=0.05)) as store:
        passes: list[int] = []
        walk = store.defragmenter._walk

        def walk_through_an_outage():  # type: ignore[no-untyped-def]
            passes.append(1)
            if len(passes) <= 2:
                raise MetadataUnavailableError("postgresql://x", "stopped")
            return walk()

        monkeypatch.setattr(store.defragmenter, "_walk", walk_through_an_outage)
        with trio.fail_after(30):
            while len(passes) < 3:  # the pass after the outage ran
                await trio.sleep(0.01)
        await store.create("alive")
        await store.append("alive", b"yes")
        assert await store.read("alive") == b"yes"
