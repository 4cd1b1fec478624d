"""fsck beside live traffic: appends, flushes, chunk roll-over, deletes and re-creates
run while fsck loops, and a defrag with its collection between fsck's stat of a chunk
and its read; no report may show damage (every one of them is false)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import ChunkMissingError
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.store.facade import SegmentStore
from tierfs.store.fsck import fsck
from tierfs.testing.harness import small_config
from tierfs.testing.storages import WrappedStorage

SEGMENTS = 4
FSCK_ROUNDS = 25


async def test_fsck_while_flushes_run_reports_no_false_damage(store: SegmentStore) -> None:
    for index in range(SEGMENTS):
        await store.create(f"s{index}")
    reports = []

    async def writer(name: str, stop: trio.Event) -> None:
        piece = name.encode() * 4000  # several appends per flush, chunks roll over
        while not stop.is_set():
            await store.append(name, piece)
            await trio.sleep(0.002)

    async def churner(stop: trio.Event) -> None:
        rounds = 0
        while not stop.is_set():
            await store.create("churn")
            await store.append("churn", b"c" * 100_000)
            await store.flush("churn")
            await store.delete("churn")
            rounds += 1

    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        for index in range(SEGMENTS):
            nursery.start_soon(writer, f"s{index}", stop)
        nursery.start_soon(churner, stop)
        for _ in range(FSCK_ROUNDS):
            reports.append(await fsck(store))
            await trio.sleep(0.01)
        stop.set()
    assert [p for r in reports for p in r.problems] == []
    assert sum(r.chunks for r in reports) > FSCK_ROUNDS * SEGMENTS  # it did look at chunks
    await store.flush()
    final = await fsck(store)
    assert final.problems == [] and final.segments == SEGMENTS


class _DefragBeforeRead(WrappedStorage):
    """The first block read of ``victim`` comes after defrag merged it away and the
    collector deleted it: the order a live fsck can meet between its stat and its read."""

    def __init__(self, inner: ChunkStorage, store: SegmentStore, segment: str, victim: str) -> None:
        super().__init__(inner)
        self._store, self._segment, self._victim = store, segment, victim
        self.struck = False

    def read(self, name: str, start: int, end: int) -> bytes:
        if name == self._victim and not self.struck:
            self.struck = True
            trio.from_thread.run(self._store.defrag, self._segment)
            while name in self.inner.list(name):  # the collector, woken by the merge
                trio.from_thread.run(trio.sleep, 0.01)
        return super().read(name, start, end)


async def test_a_chunk_merged_and_deleted_between_fsck_stat_and_read_is_no_damage(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_url=f"memory://{tmp_path.name}/chunks", flush_interval_s=3600,
                          offload_deletion_lag_s=0, defrag_interval_s=3600, defrag_min_small_chunks=2)
    async with open_store(config) as store:
        await store.create("m")
        for index in range(4):
            await store.append("m", bytes([index]) * 1000)
            await store.flush("m")
        layout = await store.chunk_layout("m")
        assert len(layout) == 4
        first = layout[0]["name"]
        racing = _DefragBeforeRead(store.chunk_storage, store, "m", first)
        store.chunk_storage = racing
        report = await fsck(store)
        assert racing.struck and report.problems == []
        assert first not in [chunk["name"] for chunk in await store.chunk_layout("m")]  # merged away
        with pytest.raises(ChunkMissingError):
            racing.inner.stat(first)
        assert (await fsck(store)).problems == []
        assert await store.read("m") == b"".join(bytes([i]) * 1000 for i in range(4))
