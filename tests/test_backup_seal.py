"""The backup seal (``engine/backup/seal.py``): a restart of a store whose newest
metadata backup is current uploads no new one; any change since, a crash or a
damaged seal means a backup at the next open."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import trio

from tierfs import StoreConfig, open_store
from tierfs.engine.backup import seal as backup_seal
from tierfs.engine.backup.objects import BackupObjects
from tierfs.engine.backup.restore import restore_metadata
from tierfs.testing.harness import small_config, start_daemon

SEAL = backup_seal.SEAL_FILE


def _config(tmp_path: Path) -> StoreConfig:
    # an interval far longer than the test: only the start-up and shutdown cycles run
    return small_config(tmp_path / "data", tier2_url=str(tmp_path / "tier2"), flush_interval_s=3600.0)


async def test_a_restart_of_an_unchanged_store_uploads_no_backup(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with open_store(config) as store:
        await store.create("logs/a", make_parents=True)
        await store.append("logs/a", b"kept")
    assert (config.data_dir / SEAL).exists()
    manifests = BackupObjects(config.chunk_store_url).manifests()
    for _ in range(2):
        async with open_store(config) as store:
            assert not (config.data_dir / SEAL).exists()  # a crash from here leaves none
            assert store.metadata_backup is not None
            assert not await store.metadata_backup.cycle()
            assert store.metadata_backup.backups_taken == 0
        assert BackupObjects(config.chunk_store_url).manifests() == manifests
    async with open_store(config) as store:
        assert store.metadata_backup is not None
        await store.create("logs/b")
        await store.flush()  # the change is shipped to tier-2 (the change log), not snapshotted
        assert not await store.metadata_backup.cycle() and store.metadata_backup.shipments >= 1
    restored = restore_metadata(tmp_path / "restored", config.chunk_store_url)
    assert restored.segments == 2


async def test_a_change_made_while_the_store_was_closed_is_backed_up_at_the_next_open(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    async with open_store(config) as store:
        await store.create("a")
    time.sleep(0.02)  # the file's times move on at the clock's granularity
    db = sqlite3.connect(config.data_dir / "metadata.sqlite")
    db.execute("UPDATE segments SET name = 'b' WHERE name = 'a'")
    db.commit()
    db.close()
    async with open_store(config) as store:
        assert store.metadata_backup is not None
        await store.metadata_backup.cycle()  # the start-up cycle may have taken it first
        assert store.metadata_backup.backups_taken == 1
    assert restore_metadata(tmp_path / "restored", config.chunk_store_url).segments == 1


def test_a_store_killed_after_a_change_backs_up_at_the_next_open(tmp_path: Path) -> None:
    config = _config(tmp_path)

    async def first_session() -> None:
        async with open_store(config) as store:
            await store.create("before")

    trio.run(first_session)
    assert (config.data_dir / SEAL).exists()
    daemon = start_daemon(config.data_dir, "--tier2", config.chunk_store_url, verbose=False)
    try:
        assert not (config.data_dir / SEAL).exists()
        daemon.client().create("after")
    finally:
        daemon.kill9()
    assert not (config.data_dir / SEAL).exists()

    async def next_open() -> None:
        async with open_store(config) as store:
            assert store.metadata_backup is not None
            await store.metadata_backup.cycle()
            assert store.metadata_backup.backups_taken == 1
            assert {info.name for info in await store.list()} == {"after", "before"}

    trio.run(next_open)


def test_a_damaged_or_stale_seal_is_no_seal_and_is_removed(tmp_path: Path) -> None:
    database = tmp_path / "metadata.sqlite"
    db = sqlite3.connect(database)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    (tmp_path / SEAL).write_text("{not json")
    assert not backup_seal.take(database)
    assert not (tmp_path / SEAL).exists()
    backup_seal.write(database)
    assert backup_seal.take(database)
    backup_seal.write(database)
    time.sleep(0.02)
    os.utime(database)  # touched: the seal no longer describes it
    assert not backup_seal.take(database)
    assert not backup_seal.take(database)  # and it is gone


async def test_no_seal_when_the_last_change_was_not_backed_up(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with open_store(config) as store:
        await store.create("a")
    async with open_store(config) as store:
        backup = store.metadata_backup
        assert backup is not None

        def unreachable(*_: object) -> None:
            raise OSError("tier-2 unreachable")

        backup.objects.upload = unreachable  # type: ignore[method-assign, assignment]
        backup.objects.upload_log = unreachable  # type: ignore[method-assign, assignment]
        await store.create("b")  # neither the shutdown shipment nor its cycle can upload it
    assert backup.failures >= 1
    assert not (config.data_dir / SEAL).exists()
    async with open_store(config) as store:
        assert store.metadata_backup is not None
        await store.metadata_backup.cycle()
        assert store.metadata_backup.backups_taken == 1
    assert restore_metadata(tmp_path / "restored", config.chunk_store_url).segments == 2
