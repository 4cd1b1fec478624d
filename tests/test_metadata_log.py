"""Restore brings back every byte whose flush returned and every change older than a
flush interval (paths 7 and 8 of the data-safety issue): the metadata's change log is
shipped to tier-2 between snapshots and applied over the newest one, and a damaged
``metadata.sqlite`` is refused by name and restored with its journal replayed."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts.errors import MetadataDamagedError
from tierfs.engine.backup import metadata_backup
from tierfs.engine.backup.objects import BackupObjects, Lineage, LineageLink, LogObject, log_chain
from tierfs.engine.metadata.change_log import CHANGE_LOG, ChangeBatch, decode, encode
from tierfs.store.datadir.restore import restore_store
from tierfs.testing.harness import crash_copy, small_config

# Snapshots an hour apart: only the change log can bring back what follows the first.
RARE_SNAPSHOTS = dict(flush_interval_s=360.0, orphan_gc_interval_s=0)


def _host_lost(tier2: Path, at: Path) -> None:
    """Tier-2 as it is at this moment, for a restore after the host and its disk are gone."""
    shutil.copytree(tier2, at)


async def test_a_restore_brings_back_every_change_a_flush_returned_on(tmp_path: Path) -> None:
    tier2 = tmp_path / "t2"
    config = small_config(tmp_path / "d", tier2_url=str(tier2), **RARE_SNAPSHOTS)
    async with open_store(config) as store:
        await store.create("first")
        await store.flush()
        # the first snapshot was taken at the open; everything below is in no snapshot
        for index in range(300):
            await store.create(f"logs/s{index:03d}", make_parents=True)
            await store.append(f"logs/s{index:03d}", b"%03d;" % index)
        await store.mkdir("empty-dir")
        await store.rename("first", "renamed")
        await store.flush()  # returned: a restore must find every byte and name
        _host_lost(tier2, tmp_path / "t2-then")
        assert store.metadata_backup is not None and store.metadata_backup.shipments >= 1
    restored_config = small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then"), **RARE_SNAPSHOTS)
    report = await restore_store(restored_config)
    assert report.changes_applied >= 1 and report.changes_missing is None
    assert report.fsck.problems == []
    async with open_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then"))) as store:
        names = {info.name for info in await store.list("logs")}
        assert len(names) == 300
        for index in (0, 150, 299):
            assert await store.read(f"logs/s{index:03d}") == b"%03d;" % index
        assert {info.name for info in await store.list("")} >= {"renamed", "empty-dir", "logs"}


async def test_a_tier2_append_is_acknowledged_once_a_restore_would_find_it(tmp_path: Path) -> None:
    tier2 = tmp_path / "t2"
    config = small_config(tmp_path / "d", tier2_url=str(tier2), **RARE_SNAPSHOTS)
    async with open_store(config) as store:
        await store.create("t", durability="tier2")
        for index in range(20):
            await store.append("t", b"record %02d\n" % index)
        _host_lost(tier2, tmp_path / "t2-then")  # right after the last acknowledgement
    await restore_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then")))
    async with open_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then"))) as store:
        assert await store.read("t") == b"".join(b"record %02d\n" % i for i in range(20))


async def test_a_damaged_metadata_file_is_refused_and_restore_replays_the_journal(tmp_path: Path) -> None:
    tier2, data = tmp_path / "t2", tmp_path / "d"
    config = small_config(data, tier2_url=str(tier2), flush_bytes=1 << 30, flush_interval_s=3600.0)
    async with open_store(config) as store:
        await store.create("pd")
        await store.append("pd", b"flushed;")
        await store.flush()
        for index in range(50):
            await store.append("pd", b"journal-only %02d;" % index)  # acknowledged, never flushed
        crash = tmp_path / "crash"  # kill -9 now: the data dir and tier-2 as they are
        crash_copy(data, crash)
        _host_lost(tier2, tmp_path / "t2-then")
    for name in ("metadata.sqlite", "metadata.sqlite-wal"):
        path = crash / name
        if path.exists():
            path.write_bytes(b"\x00garbage" * 512)
    crashed = small_config(crash, tier2_url=str(tmp_path / "t2-then"), takeover=True)
    with pytest.raises(MetadataDamagedError, match=f"tierfs restore --data-dir {crash}"):
        async with open_store(crashed):
            pass
    report = await restore_store(crashed)
    assert report.fsck.problems == [] and report.appends_replayed == 50, report
    async with open_store(crashed) as store:
        expected = b"flushed;" + b"".join(b"journal-only %02d;" % i for i in range(50))
        assert await store.read("pd") == expected


async def test_a_missing_metadata_file_beside_its_journal_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    config = small_config(data, flush_bytes=1 << 30, flush_interval_s=3600.0)
    async with open_store(config) as store:
        await store.create("pd")
        await store.append("pd", b"journal-only")
        crash = tmp_path / "crash"
        # not the backup's temporary files: one may be renamed while the copy lists them
        shutil.copytree(data, crash, ignore=shutil.ignore_patterns("LOCK", "*.sock", "metadata.*", "*.part"))
    with pytest.raises(MetadataDamagedError, match="missing"):
        async with open_store(small_config(crash, takeover=True)):
            pass
    assert not (crash / "metadata.sqlite").exists()  # nothing was made in its place


def test_batches_round_trip_and_a_damaged_one_is_refused() -> None:
    batch = ChangeBatch(3, 9, [("segments", [7], [7, "a/b", 2, b"\x00\x01"]), ("garbage", ["x"], None)])
    assert decode(encode(batch)) == batch
    damaged = bytearray(encode(batch))
    damaged[30] ^= 1
    with pytest.raises(ValueError):
        decode(bytes(damaged))
    with pytest.raises(ValueError):
        decode(encode(batch)[:-20])


def test_a_later_epoch_wins_where_logs_overlap() -> None:
    logs = [LogObject(5, 1, 10), LogObject(5, 11, 20), LogObject(6, 15, 30), LogObject(4, 21, 40)]
    assert log_chain(logs, after_seq=0, from_epoch=5) == [LogObject(5, 1, 10), LogObject(6, 15, 30)]
    assert log_chain(logs, after_seq=12, from_epoch=5) == [LogObject(6, 15, 30)]


async def test_the_change_log_is_pruned_once_shipped(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "t2"), **RARE_SNAPSHOTS)
    async with open_store(config) as store:
        for index in range(10):
            await store.create(f"s{index}")
        await store.flush()
        db = sqlite3.connect(tmp_path / "d" / "metadata.sqlite")
        try:
            assert db.execute(f"SELECT count(*) FROM {CHANGE_LOG}").fetchone()[0] == 0
        finally:
            db.close()
    assert BackupObjects(str(tmp_path / "t2")).logs()


async def test_a_local_tier2_is_owner_only_backups_included(tmp_path: Path) -> None:
    tier2 = tmp_path / "t2"
    async with open_store(small_config(tmp_path / "d", tier2_url=str(tier2))) as store:
        await store.create("secret/names", make_parents=True)
        await store.append("secret/names", b"x")
        await store.flush()
    assert BackupObjects(str(tier2)).manifests() and BackupObjects(str(tier2)).logs()
    for path in [tier2, *tier2.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path} is {mode:o}"


def test_a_restore_follows_one_lineage_back_through_its_parents() -> None:
    # 1 -> 2 -> 4 (the original, taken back), 1 -> 2 -> 3 (a copy that took over at 2's change 40)
    links = [LineageLink(1, 0, 0), LineageLink(2, 1, 10), LineageLink(3, 2, 40), LineageLink(4, 2, 55)]
    lineage = Lineage.of(links)
    assert lineage.head == 4
    assert lineage.holds(4, 10**9) and lineage.holds(2, 55) and lineage.holds(1, 10)
    assert not lineage.holds(3, 41)  # the sibling
    assert not lineage.holds(2, 56) and not lineage.holds(1, 11)  # a parent after its child took over
    assert Lineage.of([]).holds(7, 10**9)  # a store older than links: every backup, as before
    older = Lineage.of([LineageLink(5, 3, 30)])  # epochs 1-3 wrote no links
    assert older.holds(2, 30) and not older.holds(2, 31) and not older.holds(4, 1)


async def test_a_restore_takes_nothing_from_a_copy_that_held_tier2_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier2, data = tmp_path / "t2", tmp_path / "d"
    async with open_store(small_config(data, tier2_url=str(tier2), **RARE_SNAPSHOTS)) as store:
        await store.create("both")
        await store.flush()
    shutil.copytree(data, tmp_path / "copy")
    async with open_store(small_config(tmp_path / "copy", tier2_url=str(tier2), takeover=True,
                                       **RARE_SNAPSHOTS)) as copy:
        for name in ("copy-only", "copy-only-too", "copy-only-as-well"):
            await copy.create(name)
        await copy.flush()
        with monkeypatch.context() as patch:  # the copy's newest snapshot holds its names
            patch.setattr(metadata_backup, "SNAPSHOT_AFTER_CHANGES", 1)
            assert copy.metadata_backup is not None
            await copy.metadata_backup.cycle()  # False if the first cycle, late, took them already
        newest = max((m for m in BackupObjects(str(tier2)).manifests() if m.epoch == copy.epoch),
                     key=lambda m: m.log_seq)
        assert newest.log_seq >= copy.metadata.last_change_seq()
    async with open_store(small_config(data, tier2_url=str(tier2), takeover=True, **RARE_SNAPSHOTS)) as store:
        await store.create("original-only")
        await store.append("original-only", b"kept")
        await store.flush()
        epoch = store.epoch
        _host_lost(tier2, tmp_path / "t2-then")
    # the original's snapshots after it took tier-2 back, if any, are damaged: restore
    # goes back to an older one of its own lineage, never to the copy's
    for snapshot in (tmp_path / "t2-then" / "_metadata").glob(f"e{epoch:012d}-b*.sqlite"):
        snapshot.write_bytes(b"damaged")
    report = await restore_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then")))
    assert report.changes_missing is None and report.fsck.problems == []
    async with open_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then"))) as store:
        assert {info.name for info in await store.list("")} == {"both", "original-only"}
        assert await store.read("original-only") == b"kept"


async def test_a_restore_never_references_an_object_garbage_collection_deleted(tmp_path: Path) -> None:
    tier2 = tmp_path / "t2"
    config = small_config(tmp_path / "d", tier2_url=str(tier2), offload_deletion_lag_s=0, **RARE_SNAPSHOTS)
    async with open_store(config) as store:
        for name in ("deleted", "kept"):
            await store.create(name)
            await store.append(name, name.encode() * 1000)
        await store.flush()
        await store.delete("deleted")  # its chunk is queued as garbage
        await store.garbage.collect()  # and deleted, long before the next shipment's interval
        _host_lost(tier2, tmp_path / "t2-then")
    report = await restore_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then")))
    assert report.fsck.problems == []
    async with open_store(small_config(tmp_path / "new", tier2_url=str(tmp_path / "t2-then"))) as store:
        assert {info.name for info in await store.list("")} == {"kept"}
        assert await store.read("kept") == b"kept" * 1000
