"""Orphan garbage collection: objects no metadata references, left by a kill -9 between a
flush's chunk write and its commit, or by an offload upload that outlived its chunk,
are listed by ``gc --dry-run`` and ``fsck`` and deleted by ``gc`` once older than the
grace period; referenced, in-flight, newer-epoch and other-shaped objects never are.
Local tier-2 and S3 (moto server), in-process, through the daemon and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.config import StoreConfig, load_config
from tierfs.contracts.errors import InvalidArgumentError, Tier2Error
from tierfs.contracts.reports.gc import LONG_TERM, TIER2, GcReport
from tierfs.engine.object_keys import OffloadKeys, chunk_name, new_attempt_uuid
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.testing.crash import FLUSH_CHUNK_WRITTEN, crash_environment, wait_for_crash
from tierfs.testing.harness import KiB, small_config, start_daemon
from tierfs.testing.storages import WrappedStorage

PAYLOAD = os.urandom(200 * KiB)
HOUR_S = 3600.0


CRASHED_SEGMENT = 2  # logs/a: the directory logs took id 1 (one id sequence for both)


def _crash_in_flush(data_dir: Path, env: dict[str, str] | None = None) -> None:
    """A daemon dies (SIGKILL) right after writing its first chunk object, before the
    commit; PAYLOAD is durable in its journal (PD)."""
    daemon = start_daemon(data_dir, env={**(env or {}), **crash_environment(FLUSH_CHUNK_WRITTEN)})
    client = daemon.client()
    client.create("logs/a", parents=True)
    client.append("logs/a", PAYLOAD)
    code, stderr = wait_for_crash(daemon, timeout_s=30)  # the flush interval starts it
    client.close()
    assert code == -signal.SIGKILL, stderr[-2000:]
    assert f"crash point {FLUSH_CHUNK_WRITTEN} reached" in stderr


def _names(report: GcReport) -> list[tuple[str, str]]:
    return sorted((o.store, o.name) for o in report.orphans)


def _touch_old(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    old_s = time.time() - 10 * HOUR_S
    os.utime(path, (old_s, old_s))


async def test_kill_9_in_a_flush_leaves_an_orphan_chunk_that_gc_deletes_after_the_grace(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    _crash_in_flush(data_dir)
    orphan = chunk_name(CRASHED_SEGMENT, 1, 1)  # epoch 1, first chunk (seq 1): never committed
    chunks_dir = data_dir / "chunks"
    assert (chunks_dir / orphan).exists()
    # objects gc must never touch, however old: not chunk-shaped, or a newer owner's
    others = ["_owner/claim", "_metadata/backup-1", f"s{CRASHED_SEGMENT:08d}/notes.txt",
              f"s{CRASHED_SEGMENT:08d}/e000001-c00000000.tmp", chunk_name(CRASHED_SEGMENT, 999999, 0)]
    for name in others:
        _touch_old(chunks_dir / name)
    # names of the next owner (epoch 2): below the segment's next chunk sequence no flush
    # will write again; at or above it, or of a segment the metadata does not know, a
    # flush may be writing right now
    own_epoch_orphan = chunk_name(CRASHED_SEGMENT, 2, 0)
    own_epoch_in_flight = [chunk_name(CRASHED_SEGMENT, 2, 50), chunk_name(77, 2, 1)]
    for name in [own_epoch_orphan, *own_epoch_in_flight]:
        _touch_old(chunks_dir / name)

    config = small_config(data_dir, orphan_grace_s=HOUR_S, orphan_gc_interval_s=0)
    async with open_store(config) as store:
        assert store.epoch == 2
        await store.flush()
        assert await store.read("logs/a") == PAYLOAD  # replayed from the journal
        referenced = [c.name for c in await store.chunks_of(store._segment("logs/a"))]
        assert referenced and all(n.startswith(f"s{CRASHED_SEGMENT:08d}/e000002-") for n in referenced)

        assert store._segment("logs/a").record.next_chunk_seq == 2
        report = await store.fsck()
        assert report.problems == []
        both = [(TIER2, orphan), (TIER2, own_epoch_orphan)]
        assert sorted((o.store, o.name) for o in report.orphans) == both
        assert all(o.size_bytes > 0 for o in report.orphans)

        young = await store.gc(dry_run=True)  # the crash was a moment ago: within the grace
        assert _names(young) == [(TIER2, own_epoch_orphan)]
        assert (young.kept_young, young.kept_in_flight, young.kept_newer_epoch) == (1, 2, 1)

        real_now = store.clock
        store.clock = lambda: real_now() + HOUR_S + 1
        listed = await store.gc(dry_run=True)
        assert _names(listed) == both and listed.dry_run
        assert (chunks_dir / orphan).exists()  # a dry run deletes nothing

        deleted = await store.gc()
        assert _names(deleted) == both and not deleted.dry_run
        assert deleted.orphan_bytes == listed.orphan_bytes > 0 and deleted.failed == []
        assert not (chunks_dir / orphan).exists() and not (chunks_dir / own_epoch_orphan).exists()
        kept = referenced + others + own_epoch_in_flight
        assert all((chunks_dir / name).exists() for name in kept)
        store.block_cache.clear()
        assert await store.read("logs/a") == PAYLOAD
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []
        assert (await store.gc()).orphans == []


class _BlockingWrites(WrappedStorage):
    """Writes go through, then the writing thread waits for ``release``: a flush caught
    between its chunk write and its commit."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.written = threading.Event()
        self.release = threading.Event()

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        super().write(name, offset, data)
        self.written.set()
        self.release.wait(30)


async def _wait_until(predicate: Any, timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.01)


async def test_a_chunk_being_flushed_is_never_touched(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", orphan_grace_s=0, orphan_gc_interval_s=0)
    async with open_store(config) as store:
        blocking = _BlockingWrites(store.chunk_storage)
        store.chunk_storage = blocking
        await store.create("a")
        await store.append("a", PAYLOAD[: 100 * KiB])
        await _wait_until(blocking.written.is_set)  # written, commit not yet run
        in_flight = chunk_name(1, store.epoch, 1)
        assert (config.data_dir / "chunks" / in_flight).exists()
        report = await store.gc()
        assert report.orphans == [] and report.kept_in_flight == 1
        assert (await store.fsck()).orphans == []
        blocking.release.set()
        await store.flush()
        assert [c.name for c in await store.chunks_of(store._segment("a"))] == [in_flight]
        store.block_cache.clear()
        assert await store.read("a") == PAYLOAD[: 100 * KiB]
        report = await store.gc()
        assert report.orphans == [] and report.kept_in_flight == 0


async def test_an_upload_in_flight_is_never_touched_and_its_leftover_is(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", offload_url=str(tmp_path / "longterm"),
                          orphan_grace_s=0, orphan_gc_interval_s=0)
    async with open_store(config) as store:
        long_term = store.long_term
        assert long_term is not None
        release = threading.Event()
        real_put = long_term.put

        def put_then_wait(key: str, data: bytes, metadata: Any) -> None:
            real_put(key, data, metadata)
            release.wait(30)

        long_term.put = put_then_wait  # type: ignore[method-assign]
        key = OffloadKeys.for_attempt(chunk_name(9, 1, 0), new_attempt_uuid()).data
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.offloader._put, long_term, key, b"offloaded bytes")
            await _wait_until(lambda: (tmp_path / "longterm" / key).exists())
            report = await store.gc()
            assert report.orphans == [] and report.kept_in_flight == 1
            release.set()
        assert key not in store.offloader.uploading
        assert [(o.store, o.name) for o in (await store.fsck()).orphans] == [(LONG_TERM, key)]
        assert _names(await store.gc()) == [(LONG_TERM, key)]
        assert not (tmp_path / "longterm" / key).exists()


@pytest.fixture
def s3_urls(s3_bucket: tuple[str, dict[str, Any]]) -> dict[str, str]:
    url, options = s3_bucket
    bucket = url.split("/")[2]
    return {"bucket": bucket, "tier2": url, "longterm": f"s3://{bucket}/longterm",
            "endpoint": str(options["endpoint_url"])}


def _s3_keys(urls: dict[str, str], prefix: str) -> list[str]:
    """Keys under ``prefix``, without the owner claims and metadata backups, which gc never touches."""
    s3 = boto3.client("s3", endpoint_url=urls["endpoint"], region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=urls["bucket"], Prefix=prefix + "/")
    keys = (o["Key"][len(prefix) + 1 :] for o in listed.get("Contents", []))
    return sorted(k for k in keys if not k.startswith(("_owner/", "_metadata/")))


async def test_s3_orphans_of_a_crashed_flush_and_of_an_offload_that_lost_its_chunk(
    tmp_path: Path, s3_urls: dict[str, str]
) -> None:
    data_dir = tmp_path / "data"
    _crash_in_flush(data_dir, {"TIERFS_TIER2": s3_urls["tier2"],
                               "TIERFS_TIER2_ENDPOINT_URL": s3_urls["endpoint"]})
    orphan_chunk = chunk_name(CRASHED_SEGMENT, 1, 1)
    assert _s3_keys(s3_urls, "chunks") == [orphan_chunk]

    config = small_config(
        data_dir, tier2_url=s3_urls["tier2"], tier2_endpoint_url=s3_urls["endpoint"],
        offload_url=s3_urls["longterm"], offload_endpoint_url=s3_urls["endpoint"],
        offload_deletion_lag_s=HOUR_S, policy_interval_s=HOUR_S,
        orphan_grace_s=0, orphan_gc_interval_s=0,
    )
    async with open_store(config) as store:
        await store.flush()
        assert await store.read("logs/a") == PAYLOAD
        # An offload whose upload finishes after its segment was deleted: the deletion
        # queued the attempt's keys and collected them before the objects existed.
        await store.create("logs/b")
        await store.append("logs/b", PAYLOAD)
        await store.seal("logs/b")
        await store.flush("logs/b")
        long_term = store.long_term
        assert long_term is not None
        uploading: set[str] = set()  # the keys whose upload started
        deleted = threading.Event()
        real_put = long_term.put

        def put_after_delete(key: str, data: bytes, metadata: Any) -> None:
            uploading.add(key)
            deleted.wait(30)
            real_put(key, data, metadata)

        long_term.put = put_after_delete  # type: ignore[method-assign]
        seg_b = store._segment("logs/b")
        job = await store.offload("logs/b")
        # every chunk of the job is uploading (they run side by side), so each has
        # recorded its attempt: a chunk still starting would land an attempt not listed
        assert 0 < job["chunks_total"] <= config.offload_concurrency
        await _wait_until(lambda: len(uploading) == job["chunks_total"])
        attempts = [c for c in await store.chunks_of(seg_b) if c.offload_attempt_uuid]
        assert len(attempts) == job["chunks_total"], "an attempt is recorded before its upload"
        await store.delete("logs/b")
        await store.garbage.collect()  # the attempt's keys: nothing to delete yet
        deleted.set()
        await _wait_until(lambda: not store.offloader.is_running(seg_b))
        offload_orphans = _s3_keys(s3_urls, "longterm")
        # the data object lands; the index may or may not, as the offloader may notice the
        # deleted segment between the two: whatever landed is an orphan
        attempt_keys = set()
        for chunk in attempts:
            keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)
            assert keys.data in offload_orphans
            attempt_keys |= {keys.data, keys.index}
        assert set(offload_orphans) <= attempt_keys
        referenced = [c.name for c in await store.chunks_of(store._segment("logs/a"))]

        report = await store.fsck()
        assert report.problems == []
        expected = sorted([(TIER2, orphan_chunk)] + [(LONG_TERM, k) for k in offload_orphans])
        assert sorted((o.store, o.name) for o in report.orphans) == expected
        assert _names(await store.gc(dry_run=True)) == expected
        assert orphan_chunk in _s3_keys(s3_urls, "chunks")

        assert _names(await store.gc()) == expected
        assert _s3_keys(s3_urls, "chunks") == sorted(referenced)
        assert _s3_keys(s3_urls, "longterm") == []
        assert (await store.fsck()).orphans == []
        store.block_cache.clear()
        assert await store.read("logs/a") == PAYLOAD


def _cli(data_dir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_cli_gc_in_process_and_through_the_daemon(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    _crash_in_flush(data_dir)
    orphan = chunk_name(CRASHED_SEGMENT, 1, 1)
    no_grace = {"TIERFS_ORPHAN_GRACE_S": "0"}

    fsck = _cli(data_dir, "fsck", env=no_grace)  # in-process (no daemon)
    assert fsck.returncode == 0, fsck.stderr
    assert f"ORPHAN tier-2 {orphan}" in fsck.stdout and "1 orphan objects" in fsck.stdout
    kept = _cli(data_dir, "gc", "--dry-run", env={})  # the default grace: 1 h
    assert kept.returncode == 0, kept.stderr
    assert "would delete 0 orphan objects" in kept.stdout and "kept 1 younger" in kept.stdout

    daemon = start_daemon(data_dir, env=no_grace)
    try:
        dry = _cli(data_dir, "gc", "--dry-run", env={})
        assert dry.returncode == 0, dry.stderr
        assert f"would delete tier-2 {orphan}" in dry.stdout
        assert (data_dir / "chunks" / orphan).exists()
        done = _cli(data_dir, "gc", env={})
        assert done.returncode == 0, done.stderr
        assert f"deleted tier-2 {orphan}" in done.stdout and "deleted 1 orphan objects" in done.stdout
        assert not (data_dir / "chunks" / orphan).exists()
        fsck = _cli(data_dir, "fsck", env={})
        assert fsck.returncode == 0 and "ORPHAN" not in fsck.stdout, fsck.stdout
        assert daemon.client().read("logs/a") == PAYLOAD
    finally:
        daemon.stop()


async def test_background_sweep_deletes_orphans_every_interval(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", orphan_grace_s=0, orphan_gc_interval_s=0.2)
    orphan = tmp_path / "data" / "chunks" / chunk_name(5, 0, 3)  # an epoch older than any owner's
    _touch_old(orphan)
    async with open_store(config) as store:
        # the object is gone once the worker thread's delete returned; the sweep counts it
        # when it is back on the event loop
        await _wait_until(lambda: store.orphans.deleted_objects == 1, timeout_s=10)
        assert not orphan.exists()


class _RefusingDeletes(WrappedStorage):
    def delete(self, name: str) -> None:
        raise Tier2Error("injected: access denied")


async def test_a_failed_delete_is_reported_and_the_object_kept_for_the_next_sweep(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", orphan_grace_s=0, orphan_gc_interval_s=0)
    orphan = tmp_path / "data" / "chunks" / chunk_name(5, 0, 3)
    _touch_old(orphan)
    async with open_store(config) as store:
        real = store.chunk_storage
        store.chunk_storage = _RefusingDeletes(real)
        report = await store.gc()
        assert report.orphans == [] and len(report.failed) == 1
        assert chunk_name(5, 0, 3) in report.failed[0] and "access denied" in report.failed[0]
        assert orphan.exists()
        store.chunk_storage = real
        assert [o.name for o in (await store.gc()).orphans] == [chunk_name(5, 0, 3)]


def test_orphan_settings_are_checked() -> None:
    for setting in ("orphan_grace_s", "orphan_gc_interval_s"):
        with pytest.raises(InvalidArgumentError, match="must be >= 0"):
            load_config({setting: -1})
    config = load_config(environ={"TIERFS_ORPHAN_GRACE_S": "1.5", "TIERFS_ORPHAN_GC_INTERVAL_S": "0"})
    assert (config.orphan_grace_s, config.orphan_gc_interval_s) == (1.5, 0.0)
    assert (StoreConfig().orphan_grace_s, StoreConfig().orphan_gc_interval_s) == (HOUR_S, HOUR_S)


@pytest.mark.parametrize("tier2", ["local", "memory"])
async def test_sweeping_without_grace_while_flushing_and_offloading_loses_nothing(
    tmp_path: Path, tier2: str
) -> None:
    """gc with no grace at all, over and over, races every flush commit and offload
    attempt of a busy store: only the references and the in-flight rules protect them."""
    tier2_url = "" if tier2 == "local" else f"memory://gc-{os.urandom(6).hex()}"
    config = small_config(tmp_path / "data", tier2_url=tier2_url, offload_url=str(tmp_path / "longterm"),
                          offload_deletion_lag_s=0, orphan_grace_s=0, orphan_gc_interval_s=0)
    written: dict[str, bytearray] = {f"s{i}": bytearray() for i in range(3)}
    sweeps = 0
    async with open_store(config) as store:
        done = trio.Event()

        async def sweep_until_done() -> None:
            nonlocal sweeps
            while not done.is_set():
                report = await store.gc()
                assert report.orphans == [] and report.failed == []
                sweeps += 1
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sweep_until_done)
            for round_ in range(6):
                for name, data in written.items():
                    if round_ == 0:
                        await store.create(name)
                    piece = os.urandom(40 * KiB)
                    await store.append(name, piece)
                    data += piece
                    await trio.sleep(0.03)
            await store.seal("s0")
            await store.flush()
            await store.offload("s0")
            with trio.fail_after(30):
                while (await store.offload_status("s0"))["state"] == "RUNNING":
                    await trio.sleep(0.01)
            done.set()
        assert sweeps > 5
        assert (await store.offload_status("s0"))["state"] == "SUCCESS"
        store.block_cache.clear()
        for name, data in written.items():
            assert await store.read(name) == bytes(data)
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []
