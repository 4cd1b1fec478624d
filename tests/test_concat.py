"""concat(target, sources): metadata-only, atomic, no bytes copied; the building block of
exactly-once writes (a task's transaction segment merged into the target at commit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import (
    AlreadyCommittedError,
    InvalidArgumentError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.store.facade import SegmentStore
from tierfs.store.fsck import fsck
from tierfs.testing.harness import small_config, start_daemon

KiB = 1 << 10


async def _fill(store: SegmentStore, name: str, data: bytes, *, seal: bool) -> None:
    await store.create(name, make_parents=True)
    for start in range(0, len(data), 24 * KiB):
        await store.append(name, data[start : start + 24 * KiB])
    if seal:
        await store.seal(name)


async def test_concat_moves_chunks_without_copying_bytes(store: SegmentStore) -> None:
    head, tail = os.urandom(700 * KiB + 5), os.urandom(600 * KiB + 7)
    await _fill(store, "out/result", head, seal=False)
    await _fill(store, "out/_tx/task-1", tail, seal=True)
    await store.flush("out/_tx/task-1")
    source_chunks = list(await store.chunks_of(store._segment("out/_tx/task-1")))
    chunk_dir = store.config.data_dir / "chunks"
    inodes = {c.name: (chunk_dir / c.name).stat().st_ino for c in source_chunks}
    flushed_before = store.writer.flushed_bytes

    info = await store.concat("out/result", "out/_tx/task-1")
    assert info.length == len(head) + len(tail)
    assert await store.read("out/result") == head + tail
    with pytest.raises(SegmentNotFoundError):
        await store.stat("out/_tx/task-1")
    # the same chunk objects, not copies; only the target's own tail was flushed
    assert {c.name: (chunk_dir / c.name).stat().st_ino for c in source_chunks} == inodes
    assert store.writer.flushed_bytes - flushed_before <= len(head)
    await store.append("out/result", b"after")
    assert (await store.read("out/result"))[-5:] == b"after"
    await store.flush()
    assert (await fsck(store)).problems == []


async def test_concat_survives_a_restart(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data")
    a, b = os.urandom(300 * KiB), os.urandom(500 * KiB)
    async with open_store(config) as store:
        await _fill(store, "t", a, seal=False)
        await _fill(store, "s", b, seal=True)
        await store.concat("t", "s")
    async with open_store(config) as store:
        assert await store.read("t") == a + b
        assert [info.name for info in await store.walk_segments()] == ["t"]
        assert (await fsck(store)).problems == []


async def test_appends_during_a_concat_land_after_the_source(store: SegmentStore) -> None:
    await _fill(store, "t", b"x" * (200 * KiB), seal=False)
    await _fill(store, "s", b"y" * (300 * KiB), seal=True)
    offsets: list[int] = []

    async def appender() -> None:
        for _ in range(20):
            offsets.append(await store.append("t", b"z" * 100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.concat, "t", "s")
        nursery.start_soon(appender)
    data = await store.read("t")
    assert len(data) == 500 * KiB + 2000
    assert data.count(b"y") == 300 * KiB and data.count(b"z") == 2000
    for offset in offsets:  # every append is whole and either before or after the source
        assert data[offset : offset + 100] == b"z" * 100
    assert data.rstrip(b"z").endswith(b"y") or data.index(b"y") > max(offsets)


async def test_bad_concats_change_nothing(store: SegmentStore) -> None:
    await _fill(store, "t", b"target", seal=False)
    await _fill(store, "open", b"not sealed", seal=False)
    await _fill(store, "done", b"sealed", seal=True)
    await _fill(store, "done2", b"also sealed", seal=True)
    with pytest.raises(InvalidArgumentError, match="must be sealed"):
        await store.concat("t", "open")
    with pytest.raises(InvalidArgumentError, match="onto itself"):
        await store.concat("done", "done")
    with pytest.raises(SegmentNotFoundError):
        await store.concat("t", "missing")
    with pytest.raises(SegmentSealedError):
        await store.concat("done", "done2")
    assert await store.read("t") == b"target"
    assert await store.read("open") == b"not sealed"
    assert await store.read("done") == b"sealed"
    assert await store.read("done2") == b"also sealed"


async def test_many_sources_in_order_in_one_transaction(store: SegmentStore) -> None:
    parts = [os.urandom(100 * KiB + i) for i in range(4)]
    await _fill(store, "out/r", b"head", seal=False)
    for i, part in enumerate(parts):
        await _fill(store, f"tx/p{i}", part, seal=True)
    await _fill(store, "tx/open", b"unsealed", seal=False)
    with pytest.raises(InvalidArgumentError, match="must be sealed"):  # one bad source: none moves
        await store.concat("out/r", ["tx/p0", "tx/p1", "tx/open"])
    assert await store.read("out/r") == b"head"
    assert await store.read("tx/p0") == parts[0]
    info = await store.concat("out/r", [f"tx/p{i}" for i in (2, 0, 3, 1)])
    assert await store.read("out/r") == b"head" + parts[2] + parts[0] + parts[3] + parts[1]
    assert info.length == 4 + sum(map(len, parts))
    assert [i.name for i in await store.walk_segments()] == ["out/r", "tx/open"]
    await store.flush()
    assert (await fsck(store)).problems == []


async def test_writer_marks_make_a_replayed_commit_change_nothing(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data")
    async with open_store(config) as store:
        await _fill(store, "out", b"", seal=False)
        await _fill(store, "b0", b"batch 0\n", seal=True)
        await store.concat("out", "b0", writer="query-1", writer_seq=0)
        await _fill(store, "b0-again", b"batch 0\n", seal=True)
        with pytest.raises(AlreadyCommittedError):
            await store.concat("out", "b0-again", writer="query-1", writer_seq=0)
        assert await store.read("b0-again") == b"batch 0\n"  # left for the caller to delete
        await _fill(store, "other", b"other writer\n", seal=True)
        await store.concat("out", "other", writer="query-2", writer_seq=0)
        with pytest.raises(InvalidArgumentError):
            await store.concat("out", "b0-again", writer_seq=3)
    async with open_store(config) as store:  # the marks are durable
        with pytest.raises(AlreadyCommittedError):
            await store.concat("out", "b0-again", writer="query-1", writer_seq=0)
        await _fill(store, "b1", b"batch 1\n", seal=True)
        await store.concat("out", "b1", writer="query-1", writer_seq=1)
        assert await store.read("out") == b"batch 0\nother writer\nbatch 1\n"


def test_concat_through_the_daemon_and_the_cli(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "data")
    try:
        client = daemon.client()
        client.create("t")
        client.append("t", b"hello ")
        client.create("s")
        client.append("s", b"world")
        client.op("seal", path="s")
        done = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(daemon.data_dir),
                               "concat", "t", "s"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "11"
        assert client.read("t") == b"hello world"
        for name, data in (("x", b"!"), ("y", b"?"), ("s2", b"again")):
            client.create(name)
            client.append(name, data)
            client.op("seal", path=name)
        info = client.op("concat", target="t", sources=["y", "x"], writer="job", writer_seq=7)
        assert info["length"] == 13 and client.read("t") == b"hello world?!"
        with pytest.raises(AlreadyCommittedError):
            client.op("concat", target="t", sources=["s2"], writer="job", writer_seq=7)
        assert client.read("t") == b"hello world?!" and client.read("s2") == b"again"
        with pytest.raises(InvalidArgumentError):
            client.op("concat", target="t", sources="s2")
        with pytest.raises(InvalidArgumentError):
            client.op("concat", target="t", sources=["s2"], writer="job", writer_seq="8")
        assert client.read("s2") == b"again"
        refused = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(daemon.data_dir),
                                  "concat", "t", "t"], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "onto itself" in refused.stderr
        client.close()
    finally:
        daemon.stop()
