"""Storage writer: triggers, rollover, object-store chunks, failures and backlog."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tierfs import open_store
from tierfs.contracts.errors import BacklogFullError, Tier2Error
from tierfs.testing.harness import KiB, small_config
from tierfs.testing.storages import FlakyStorage


async def _wait(predicate, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` every 10 ms of trio time; fail after ``timeout_s`` real seconds
    (under ``_autojump`` a trio timeout would fire while a flush does real I/O)."""
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            raise TimeoutError(f"condition still false after {timeout_s} s")
        await trio.sleep(0.01)


@contextlib.contextmanager
def _autojump(clock: MockClock) -> Iterator[None]:
    """Inside the block the test's mock clock jumps to the next deadline whenever every
    task is blocked; outside it stands still, so no timer fires during real I/O (open,
    fdatasync, SQLite, shutdown's flush), and nothing there may wait for one.

    Only around waits for the engine's timers, with no trio timeout around real I/O in
    the block: while a worker thread works every task is blocked too, and the clock races
    ahead (seconds of trio time during one flush)."""
    clock.autojump_threshold = 0
    try:
        yield
    finally:
        clock.autojump_threshold = math.inf


async def test_flushes_by_size(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", flush_interval_s=1.5, flush_bytes=32 * KiB)
    async with open_store(config) as store:
        await store.create("size")
        await store.append("size", b"s" * (40 * KiB))
        start = trio.current_time()
        await _wait(lambda: store.table.segment("size").flushed_length == 40 * KiB, 1.4)
        assert trio.current_time() - start < config.flush_interval_s  # size, not age


async def test_flushes_by_age(tmp_path: Path, mock_clock: MockClock) -> None:
    config = small_config(tmp_path / "d", flush_interval_s=1.5, flush_bytes=32 * KiB)
    async with open_store(config) as store:
        await store.create("age")
        await store.append("age", b"a" * 100)
        # Timer-driven: the writer's tick and the 1.5 s interval pass in no real time; the
        # flush they trigger does real I/O, which _wait (bounded in real time) tolerates.
        with _autojump(mock_clock):
            await trio.sleep(0.3)
            assert store.table.segment("age").flushed_length == 0
            await _wait(lambda: store.table.segment("age").flushed_length == 100, 5.0)


async def test_rolls_over_at_max_chunk_size_and_deletes_journal_files(config) -> None:  # type: ignore[no-untyped-def]
    async with open_store(config) as store:
        await store.create("r")
        payload = bytes(range(256)) * 4
        for _ in range(1000):  # ~1 MiB
            await store.append("r", payload)
        await store.flush("r")
        layout = await store.chunk_layout("r")
        assert len(layout) >= 4
        assert all(c["end"] - c["start"] <= config.max_chunk_bytes for c in layout)
        assert [c["start"] for c in layout[1:]] == [c["end"] for c in layout[:-1]]
        stats = store.statistics()
        assert stats.journal_files_deleted > 0
        assert stats.unflushed_bytes == 0
        assert await store.read("r") == payload * 1000


async def test_object_store_gets_one_object_per_flush(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_url=f"memory://{tmp_path.name}/chunks")
    async with open_store(config) as store:
        assert not store.chunk_storage.supports_append
        await store.create("m")
        for i in range(3):
            await store.append("m", bytes([i]) * 1000)
            await store.flush("m")
        layout = await store.chunk_layout("m")
        assert len(layout) == 3
        assert len(store.chunk_storage.list("s")) == 3  # _metadata/ holds backups
        assert await store.read("m") == b"".join(bytes([i]) * 1000 for i in range(3))


async def test_tier2_failure_retries_without_blocking_appends(
    tmp_path: Path, mock_clock: MockClock
) -> None:
    config = small_config(
        tmp_path / "d", tier2_retry_initial_s=0.01, tier2_retry_max_s=0.05,
        max_backlog_bytes=200 * KiB, max_append_bytes=64 * KiB,
    )
    async with open_store(config) as store:
        flaky = FlakyStorage(store.chunk_storage)  # the local chunk store, tmp_path/d/chunks
        store.chunk_storage = flaky
        await store.create("f")
        for _ in range(3):
            await store.append("f", b"q" * (64 * KiB))
        # Timer-driven: the retries' backoff and the writer's tick; FlakyStorage fails
        # before any I/O.
        with _autojump(mock_clock):
            await _wait(lambda: flaky.attempts >= 3)
        assert store.statistics().flush_failures >= 2
        with pytest.raises(BacklogFullError) as excinfo:
            await store.append("f", b"q" * (64 * KiB))
        assert excinfo.value.limit_bytes == 200 * KiB
        assert (await store.stat("f")).length == 3 * 64 * KiB  # the refused append left nothing
        with pytest.raises(Tier2Error):
            await store.flush("f")
        flaky.failing = False
        await store.flush("f")
        assert (await store.stat("f")).flushed_length == 3 * 64 * KiB
        await store.append("f", b"ok")
        assert (await store.read("f"))[-2:] == b"ok"


async def test_tail_memory_is_bounded_and_evicted_bytes_come_from_the_journal(tmp_path: Path) -> None:
    config = small_config(
        tmp_path / "d", tail_memory_bytes=64 * KiB, flush_bytes=1 << 30, flush_interval_s=3600
    )
    async with open_store(config) as store:
        await store.create("t")
        expected = bytearray()
        for i in range(200):
            record = bytes([i]) * 2000
            await store.append("t", record)
            expected += record
        assert store.tail_budget.used_bytes <= 64 * KiB + 2000
        assert store.tail_budget.evicted_entries > 0
        assert await store.read("t") == bytes(expected)
        await store.flush("t")
        assert await store.read("t") == bytes(expected)


class _DeletingCatalogue:
    """The flusher's catalogue, but loading the chunk records of ``victim`` deletes it
    first: the delete a real store can run while a flush waits for the metadata."""

    def __init__(self, catalogue: Any, store: Any, victim: str) -> None:
        self._catalogue, self._store, self._victim = catalogue, store, victim

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalogue, name)

    async def chunks_of(self, seg: Any) -> Any:
        if seg.name == self._victim and not seg.deleted:
            await self._store.delete(self._victim)
        return await self._catalogue.chunks_of(seg)


async def test_a_segment_deleted_while_its_batch_plans_is_left_out(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", flush_interval_s=3600)
    async with open_store(config) as store:
        for name in ("gone", "kept"):
            await store.create(name)
            await store.append(name, name.encode() * 100)
        flusher = store.writer._flusher
        flusher._catalogue = _DeletingCatalogue(flusher._catalogue, store, "gone")
        for name in ("gone", "kept"):  # both due at once: one batch
            store.writer.request_flush(store.table.segment(name))
        await store.flush("kept")
        assert await store.read("kept") == b"kept" * 100
        assert [info.name for info in await store.list("")] == ["kept"]
        assert store.writer.unflushed_bytes == 0
        assert len(store.chunk_storage.list("s")) == 1  # nothing was written for "gone"
