"""Durability level tier2: an append is acknowledged once its bytes are in tier-2 and the
chunk record and flushed length are committed, so it survives the loss of the host.

In-process (``open_store``): the acknowledgement waits for the commit, group commit
(appends arriving during a flush share the next one), a tier-2 outage, deletion,
fencing, cancellation, whole appends at flush and chunk limits, readers' LAC. With real
daemons: kill -9 and the loss of the journal, the CLI, fsspec.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from tierfs.fsspec_impl import TierFileSystem

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    FencedError,
    InvalidArgumentError,
    SegmentNotFoundError,
    TierFSError,
)
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.store.facade import SegmentStore, open_store
from tierfs.testing.harness import Daemon, small_config, start_daemon
from tierfs.testing.storages import FlakyStorage, WrappedStorage

WAIT_S = 30.0  # bound for what happens "soon" on a loaded machine


async def _until(predicate: Callable[[], Awaitable[bool]]) -> None:
    with trio.fail_after(WAIT_S):
        while not await predicate():
            await trio.sleep(0.005)


class HeldStorage(WrappedStorage):
    """Every ``write`` (in its worker thread) waits until ``release`` is set."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self.writes = 0

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        self.writes += 1
        self.release.wait(WAIT_S)
        super().write(name, offset, data)


def _outage_config(data_dir: Path, **overrides: object) -> StoreConfig:
    return small_config(data_dir, tier2_retry_initial_s=0.01, tier2_retry_max_s=0.05, **overrides)


# ---------------------------------------------------------------- the acknowledgement
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
        offset = await store.append("t2", b"record %03d\n" % i)
        assert (await store.stat("t2")).flushed_length >= offset + 11  # committed when acknowledged
        offsets.append(offset)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(one, i)
    info = await store.stat("t2")
    assert info.flushed_length == info.length == 200 * 11
    assert sorted(offsets) == [i * 11 for i in range(200)]
    flushes = store.statistics().flushes - flushes_before
    assert flushes < 200 // 4, flushes  # one chunk write + commit serves many appends


async def test_appends_arriving_during_a_flush_share_the_next_one(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        held = HeldStorage(store.chunk_storage)
        store.chunk_storage = held
        await store.create("t2", durability="tier2")
        flushes_before = store.statistics().flushes
        done: list[int] = []

        async def append(i: int) -> None:
            await store.append("t2", b"record %03d\n" % i)
            done.append(i)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(append, 0)

                async def first_flush_in_flight() -> bool:
                    return held.writes == 1

                await _until(first_flush_in_flight)
                for i in range(1, 101):
                    nursery.start_soon(append, i)

                async def all_journaled() -> bool:
                    return (await store.stat("t2")).durable_length == 101 * 11

                await _until(all_journaled)
                assert done == []  # nothing acknowledged while the flush is in tier-2
                held.release.set()
        finally:
            held.release.set()
        assert sorted(done) == list(range(101))
        # the first append's flush, then one chunk write and one commit for the other 100
        assert held.writes == 2 and store.statistics().flushes - flushes_before == 2
        assert (await store.stat("t2")).flushed_length == 101 * 11


# ---------------------------------------------------------------- waiting and failing
async def test_a_tier2_append_waits_through_a_tier2_outage(tmp_path: Path) -> None:
    async with open_store(_outage_config(tmp_path / "d")) as store:
        flaky = FlakyStorage(store.chunk_storage)
        store.chunk_storage = flaky
        await store.create("t2", durability="tier2")
        acknowledged = trio.Event()

        async def append() -> None:
            await store.append("t2", b"waits for tier-2")
            acknowledged.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            with trio.fail_after(WAIT_S):
                while flaky.attempts < 3:  # the writer retries with its backoff
                    await trio.sleep(0.01)
            assert not acknowledged.is_set()  # never before the bytes are in tier-2
            info = await store.stat("t2")
            # readers' LAC is unchanged: durable (fsynced) bytes are shown before tier-2 has them
            assert (info.flushed_length, info.durable_length) == (0, 16)
            assert await store.read("t2") == b"waits for tier-2"
            flaky.failing = False
            await acknowledged.wait()
        assert (await store.stat("t2")).flushed_length == 16


async def test_deleting_the_segment_fails_its_waiting_appends_at_once(tmp_path: Path) -> None:
    # no timer would wake the waiter (the fence's check interval is 30 s): the delete does
    config = _outage_config(tmp_path / "d", flush_interval_s=30.0, owner_check_interval_s=30.0)
    async with open_store(config) as store:
        flaky = FlakyStorage(store.chunk_storage)
        store.chunk_storage = flaky
        await store.create("t2", durability="tier2")
        errors: list[Exception] = []

        async def append() -> None:
            try:
                await store.append("t2", b"never acknowledged")
            except TierFSError as e:
                errors.append(e)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(append)
                while flaky.attempts < 1:
                    await trio.sleep(0.01)
                await store.delete("t2")
        assert len(errors) == 1 and isinstance(errors[0], SegmentNotFoundError), errors
        assert store.statistics().flushes == 0


async def test_a_fenced_store_fails_its_waiting_appends(tmp_path: Path) -> None:
    shared = str(tmp_path / "t2")
    async with open_store(small_config(tmp_path / "a", tier2_url=shared)) as a:
        await a.create("seg", durability="tier2")
        await a.append("seg", b"flushed;")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    config = _outage_config(tmp_path / "a", tier2_url=shared, owner_check_interval_s=0.1)
    async with open_store(config) as zombie:
        flaky = FlakyStorage(zombie.chunk_storage)
        zombie.chunk_storage = flaky
        errors: list[Exception] = []

        async def append() -> None:
            try:
                await zombie.append("seg", b"never acknowledged")
            except TierFSError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append)
            with trio.fail_after(WAIT_S):
                while flaky.attempts < 1:
                    await trio.sleep(0.01)
            async with open_store(small_config(tmp_path / "b", tier2_url=shared, takeover=True)) as owner:
                flaky.failing = False  # tier-2 is back, but the zombie no longer owns it
                with trio.fail_after(WAIT_S):
                    while not errors:
                        await trio.sleep(0.01)
                assert isinstance(errors[0], FencedError), errors
                assert await owner.read("seg") == b"flushed;"
        assert (await zombie.stat("seg")).flushed_length == 8


async def test_cancelling_a_waiting_append_leaves_the_store_consistent(tmp_path: Path) -> None:
    async with open_store(_outage_config(tmp_path / "d")) as store:
        flaky = FlakyStorage(store.chunk_storage)
        store.chunk_storage = flaky
        await store.create("t2", durability="tier2")
        with trio.move_on_after(WAIT_S) as gave_up:  # the caller gives up while it waits
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.append, "t2", b"given up;")
                while flaky.attempts < 2:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        assert not gave_up.cancelled_caught
        # in the journal, so it lands whole (an append whose answer never came)
        assert (await store.stat("t2")).appended_length == 9
        flaky.failing = False
        assert await store.append("t2", b"next") == 9
        info = await store.stat("t2")
        assert info.flushed_length == info.length == 13
        assert await store.read("t2") == b"given up;next"
        assert (await store.fsck()).problems == []


async def test_flushes_of_a_tier2_segment_never_cut_an_append(tmp_path: Path) -> None:
    # 300-byte appends, flushes and chunks of at most 1000 bytes: every chunk ends where
    # an append ends (a grown chunk without room for the next append is left for a new one)
    config = _outage_config(tmp_path / "d", max_flush_bytes=1000, max_chunk_bytes=1000)
    async with open_store(config) as store:
        flaky = FlakyStorage(store.chunk_storage)
        store.chunk_storage = flaky
        await store.create("t2", durability="tier2")
        await store.create("pd", durability="pd")
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(store.append, "t2", bytes([65 + i]) * 300)
                nursery.start_soon(store.append, "pd", bytes([65 + i]) * 300)

            async def backlog_journaled() -> bool:
                lengths = [(await store.stat(name)).durable_length for name in ("t2", "pd")]
                return flaky.attempts >= 1 and lengths == [3000, 3000]

            await _until(backlog_journaled)
            flaky.failing = False  # then the backlog goes out in flushes of <= 1000 bytes
        await store.append("t2", b"x" * 300)  # grows the last chunk while it has room
        await store.flush()
        t2 = [(c["start"], c["end"]) for c in await store.chunk_layout("t2")]
        assert all(start % 300 == 0 and end % 300 == 0 for start, end in t2), t2
        assert t2[-1][1] == 3300 and all(end - start <= 1000 for start, end in t2), t2
        pd = [(c["start"], c["end"]) for c in await store.chunk_layout("pd")]
        assert pd[0] == (0, 1000), pd  # other levels fill chunks to the byte


# ---------------------------------------------------------------- the loss of the host
RECORD = re.compile(rb"<(\d+):(\d+):(\d+):([0-9a-f]*)>")


def _writer(daemon: Daemon, key: int, acked: list[tuple[int, bytes]], pd_acked: list[int],
            stop: threading.Event) -> None:
    """Append self-describing records to t2 (and some to pd) until the daemon dies."""
    client = daemon.client()
    try:
        for seq in range(1 << 30):
            if stop.is_set():
                return
            payload = os.urandom((seq * 37 + key * 11) % 350 + 10).hex().encode()
            record = b"<%d:%d:%d:%s>" % (key, seq, len(payload), payload)
            acked.append((client.append("t2", record), record))
            if seq % 4 == 0:
                client.append("pd", record)
                pd_acked.append(len(record))
    except Exception:  # the kill: this writer's last append has no answer
        return
    finally:
        client.close()


def test_every_acknowledged_tier2_append_survives_kill_9_and_the_loss_of_the_journal(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # Only tier2 waiters make flushes (the timers are far off), and flushes and chunks are
    # small so that many flushes and chunk boundaries fall between the records.
    env = {"TIERFS_FLUSH_INTERVAL_S": "600", "TIERFS_FLUSH_BYTES": str(256 << 20),
           "TIERFS_MAX_FLUSH_BYTES": "4096", "TIERFS_MAX_CHUNK_BYTES": "16384"}
    daemon = start_daemon(data_dir, env=env)
    try:
        client = daemon.client()
        client.create("t2", durability="tier2")
        client.create("pd", durability="pd")
        client.close()
        acked: list[tuple[int, bytes]] = []
        for cycle in range(3):
            pd_acked: list[int] = []
            stop = threading.Event()
            writers = [threading.Thread(target=_writer, args=(daemon, cycle * 100 + i, acked, pd_acked, stop))
                       for i in range(8)]
            for thread in writers:
                thread.start()
            target, deadline = len(acked) + 300, time.monotonic() + WAIT_S
            while len(acked) < target and time.monotonic() < deadline:
                time.sleep(0.01)
            daemon.kill9()
            stop.set()
            for thread in writers:
                thread.join(WAIT_S)
            assert len(acked) >= target and pd_acked, "the writers made too little progress"
            shutil.rmtree(data_dir / "journal")  # the host's disk is gone; metadata kept
            daemon = start_daemon(data_dir, env=env)
            client = daemon.client()
            data = client.read("t2")
            info = client.stat("t2")
            assert info.flushed_length == info.length == len(data)  # all of it from tier-2
            for offset, record in acked:
                assert data[offset : offset + len(record)] == record, f"acknowledged append lost @{offset}"
            position, seen = 0, set()
            for match in RECORD.finditer(data):  # whole records, each once: none cut
                assert match.start() == position, f"garbage at {position}"
                assert match.group(1, 2) not in seen and int(match.group(3)) == len(match.group(4))
                seen.add(match.group(1, 2))
                position = match.end()
            assert position == len(data), f"an append cut at {position}"
            # the journal was the only copy of the PD bytes: the test did lose the host's disk
            assert client.stat("pd").length == 0
            client.close()
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr
    restarted = start_daemon(data_dir, env=env)
    try:
        client = restarted.client()
        fsck = client.op("fsck")
        client.close()
        assert fsck["problems"] == [], fsck
    finally:
        restarted.stop()


# ---------------------------------------------------------------- front ends
def _tierfs(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, **(env or {})})


def test_the_cli_creates_and_lists_tier2_segments(tmp_path: Path) -> None:
    d = tmp_path / "data"
    _tierfs(d, "create", "--durability", "tier2", "t2")
    _tierfs(d, "append", "t2", "hello")
    stat = json.loads(_tierfs(d, "stat", "t2", "--json").stdout)
    assert (stat["durability"], stat["flushed_length"]) == ("tier2", 5)
    assert _tierfs(d, "ls", "-l").stdout.split()[:3] == ["-", "5", "-t"]
    _tierfs(d, "create", "by-default", env={"TIERFS_DURABILITY": "tier2"})  # the store's default
    assert json.loads(_tierfs(d, "stat", "by-default", "--json").stdout)["durability"] == "tier2"


def test_fsspec_creates_tier2_segments_whose_flushes_are_in_tier2(tfs: TierFileSystem) -> None:
    fs = TierFileSystem(durability="tier2")
    assert pickle.loads(pickle.dumps(fs)).durability == "tier2"
    with fs.open("fsspec/t2.log", "ab") as f:
        f.write(b"first\n")
        f.flush()
        info = fs.info("fsspec/t2.log")
        assert (info["durability"], info["flushed_length"]) == ("tier2", 6)
    fs.pipe_file("fsspec/piped", b"piped")
    assert fs.info("fsspec/piped")["flushed_length"] == 5
    assert tfs.info("fsspec/t2.log")["durability"] == "tier2"
    with tfs.open("fsspec/default.log", "ab") as f:  # no option: the daemon's default
        f.write(b"x")
    assert tfs.info("fsspec/default.log")["durability"] == "pd"
    with pytest.raises(InvalidArgumentError):
        TierFileSystem(durability="strong")
