"""An orphan sweep that races a delete its owner commits afterwards (garbage collection,
an offload's hot-copy delete) never reports that object as an orphan: the sweep lists
the object, the owner deletes it and commits the metadata that drops its name, and only
then does the sweep read the references. Before the ``RemovalLog`` such a sweep deleted
the object again and reported an orphan (CI saw it once in the busy-store test)."""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.reports.gc import GcReport
from tierfs.engine.object_keys import chunk_shape
from tierfs.engine.tier2.chunk_storage import ChunkStorage, StoredObject
from tierfs.engine.upkeep.removals import RemovalLog
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import KiB, small_config
from tierfs.testing.storages import WrappedStorage


def test_a_watch_holds_every_removal_that_overlaps_it() -> None:
    log = RemovalLog()
    with log.removing(["done-before"]):
        pass
    with log.removing(["started-before", "twice"]):
        with log.watching() as removed:
            with log.removing(["started-during", "twice"]):
                pass
            assert set(removed) == {"started-before", "twice", "started-during"}
    with pytest.raises(RuntimeError), log.removing(["failed"]):
        raise RuntimeError("the delete failed")
    with log.watching() as later:
        pass
    assert set(later) == set()  # every registration ended, the failed one included


def test_concurrent_removals_of_one_name_are_counted() -> None:
    log = RemovalLog()
    with log.removing(["a"]):
        with log.removing(["a"]):
            pass
        with log.watching() as removed:
            assert "a" in removed  # the outer removal is still going on
    with log.watching() as removed:
        assert "a" not in removed


class _ListingThatWaits(WrappedStorage):
    """``list_objects`` lists, says so, then returns only once the test allows it."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.listed = threading.Event()
        self.proceed = threading.Event()

    def list_objects(self) -> list[StoredObject]:
        listing = self.inner.list_objects()
        self.listed.set()
        assert self.proceed.wait(30)
        return listing


def _chunk_names(storage: ChunkStorage) -> list[str]:
    return [o.name for o in storage.list_objects() if chunk_shape(o.name) is not None]


async def _sweep_around(store: SegmentStore, removal: Callable[[], Awaitable[None]]) -> tuple[GcReport, list[str]]:
    """A sweep (no grace) whose tier-2 listing is taken before ``removal`` runs and
    whose references are read after it; returns its report and the listed names."""
    waiting = _ListingThatWaits(store.chunk_storage)
    real = store.chunk_storage
    store.chunk_storage = waiting
    listed = _chunk_names(real)
    reports: list[GcReport] = []
    try:
        async with trio.open_nursery() as nursery:
            async def sweep() -> None:
                reports.append(await store.gc())
            nursery.start_soon(sweep)
            with trio.fail_after(30):
                while not waiting.listed.is_set():
                    await trio.sleep(0.005)
            await removal()
            waiting.proceed.set()
    finally:
        waiting.proceed.set()
        store.chunk_storage = real
    return reports[0], listed


async def test_a_sweep_racing_garbage_collection_reports_no_orphan(tmp_path: Path) -> None:
    """Defrag merges a live segment's small chunks and queues the merged-away ones (no
    deletion lag); the collection deletes them, then forgets their names."""
    config = small_config(tmp_path / "data", tier2_url=f"memory://race-{os.urandom(6).hex()}",  # one object a flush
                          offload_deletion_lag_s=0, orphan_grace_s=0, orphan_gc_interval_s=0)
    data = bytearray()
    async with open_store(config) as store:
        await store.create("s")
        for _ in range(4):
            piece = os.urandom(40 * KiB)
            await store.append("s", piece)
            data += piece
            await store.flush()
        chunks_before = _chunk_names(store.chunk_storage)
        assert len(chunks_before) == 4

        async def defrag_and_collect() -> None:
            await store.defrag("s")
            await store.garbage.collect()  # deletes the merged-away chunks, then forgets them

        report, listed = await _sweep_around(store, defrag_and_collect)
        gone = set(listed) - set(_chunk_names(store.chunk_storage))
        assert gone and gone <= set(chunks_before)  # the sweep listed what the collection deleted
        assert report.orphans == [] and report.failed == []
        assert report.kept_in_flight >= len(gone)
        store.block_cache.clear()
        assert await store.read("s") == bytes(data)
        assert (await store.gc()).orphans == []


async def test_a_sweep_racing_an_offloads_hot_copy_delete_reports_no_orphan(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", offload_url=str(tmp_path / "longterm"), offload_deletion_lag_s=0,
                          orphan_grace_s=0, orphan_gc_interval_s=0)
    data = os.urandom(300 * KiB)
    async with open_store(config) as store:
        await store.create("s")
        await store.append("s", data)
        await store.seal("s")
        await store.flush()

        async def offload() -> None:
            await store.offload("s")
            with trio.fail_after(30):
                while (await store.offload_status("s"))["state"] == "RUNNING":
                    await trio.sleep(0.01)
            assert (await store.offload_status("s"))["state"] == "SUCCESS"

        report, listed = await _sweep_around(store, offload)
        assert listed and not _chunk_names(store.chunk_storage)  # every hot copy went meanwhile
        assert report.orphans == [] and report.failed == []
        assert report.kept_in_flight >= len(listed)
        store.block_cache.clear()
        assert await store.read("s") == data
        assert (await store.gc()).orphans == []
