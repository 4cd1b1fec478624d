"""Rebuilding a data dir's metadata from the backups on tier-2 (``tierfs restore``).

Steps: refuse a data dir whose metadata still names segments; set a damaged
``metadata.sqlite`` aside (renamed, never deleted); take the newest manifest on tier-2
of the newest owner's lineage (``backup.objects.Lineage``: a sibling's backups, a copy
that took over and was taken over from, are never mixed in) whose snapshot downloads
with the right size and CRC32C and passes SQLite's integrity check (older ones are
tried in turn); apply that lineage's change batches shipped after it (``metadata.change_log``,
``backup.objects.log_chain``), in order, up to the first one that is missing or damaged;
raise the store record's epoch to the highest epoch that tier-2 shows any owner used (the snapshot's, the backups' names, the chunk names), so that the
next open's new epoch is above all of them; install the file as ``metadata.sqlite``.

The data dir's journal is kept where it is: the next open (``store.restore`` opens the
restored store) replays every intact frame above what tier-2 holds, so a damaged
``metadata.sqlite`` loses no acknowledged append its journal still has.

Invariants:
- Nothing in the data dir changes before a usable snapshot, with its changes applied,
  is on local disk; the restored database appears under its final name by one rename.
- Restore only reads tier-2: it writes no object, so a failed restore changes nothing
  there, and running it again is safe.
- What could not be brought back is reported (``RestoredMetadata.changes_missing``):
  changes after a missing or damaged batch are not applied over the gap.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierfs.contracts.errors import NoMetadataBackupError, StoreNotEmptyError
from tierfs.engine.backup.objects import BackupManifest, BackupObjects, Lineage, log_chain
from tierfs.engine.clock import now_ns
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.metadata.change_log import ChangeBatch, apply_changes, decode, last_logged_seq
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.dir_lock import DataDirLock

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.sqlite"
_CHUNK_EPOCH = re.compile(r"^(?:s\d+/e(\d+)-c\d+|packs/e(\d+)-[0-9a-f]{32})")  # a chunk or a pack


@dataclasses.dataclass(frozen=True)
class RestoredMetadata:
    manifest: BackupManifest
    segments: int
    highest_epoch_seen: int
    set_aside: tuple[str, ...]  # what was renamed out of the way in the data dir
    changes_applied: int  # change batches shipped after the snapshot, applied over it
    changes_missing: str | None  # why later batches were not applied (None: all were)


def restore_metadata(
    data_dir: Path, tier2_url: str, storage_options: Mapping[str, Any] | None = None, tier2_identity: str | None = None
) -> RestoredMetadata:
    """Blocking: install the newest usable backup of ``tier2_url`` as ``data_dir``'s
    metadata. ``NoMetadataBackupError`` if tier-2 holds none, ``StoreNotEmptyError``
    if ``data_dir`` still has readable metadata naming segments or directories."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        _refuse_live_metadata(data_dir / METADATA_FILE)
        objects = BackupObjects(tier2_url, storage_options)
        staging = data_dir / f"{METADATA_FILE}.restoring"
        lineage = objects.lineage()
        manifest = _fetch_newest_usable(objects, staging, lineage)
        applied, missing = _apply_logs(objects, staging, manifest, lineage)
        epoch = max(
            _snapshot_epoch(staging), objects.highest_epoch(),
            max((int(m.group(1) or m.group(2)) for n in objects.chunk_names() if (m := _CHUNK_EPOCH.match(n))),
                default=0),
        )
        segments = _prepare(staging, epoch, tier2_url if tier2_identity is None else tier2_identity,
                            lineage.head or manifest.epoch)
        set_aside = _set_aside(data_dir)
        os.replace(staging, data_dir / METADATA_FILE)
        fsync_directory(data_dir)
    finally:
        lock.release()
    log.info("restored %s from backup %s of %s and %d change batches after it (highest epoch seen %d)",
             data_dir, manifest.stem, tier2_url, applied, epoch)
    return RestoredMetadata(manifest, segments, epoch, set_aside, applied, missing)


def _apply_logs(objects: BackupObjects, staging: Path, manifest: BackupManifest,
                lineage: Lineage) -> tuple[int, str | None]:
    """Apply the change batches after the snapshot in ``staging``; (how many, why the
    rest were not: the first missing or damaged one, or None)."""
    db = sqlite3.connect(staging, isolation_level=None)
    try:
        after = last_logged_seq(db)
        batches: list[ChangeBatch] = []
        missing = None
        expected = after + 1
        ours = [log_object for log_object in objects.logs() if lineage.holds(log_object.epoch, log_object.last)]
        for log_object in log_chain(ours, after, manifest.epoch):
            if log_object.first > expected:
                missing = f"changes {expected}..{log_object.first - 1} are on no batch of {objects.url}"
                break
            try:
                batch = decode(objects.read_log(log_object))
            except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
                missing = f"change batch {log_object.name} on {objects.url} is unreadable ({e})"
                break
            batches.append(batch)
            expected = batch.last_seq + 1
        apply_changes(db, iter(batches))
        return len(batches), missing
    finally:
        db.close()


def _refuse_live_metadata(path: Path) -> None:
    if not path.exists():
        return
    try:
        db = sqlite3.connect(path)  # only reads; the data-dir lock keeps daemons out
        try:
            used = db.execute(
                "SELECT (SELECT count(*) FROM segments) + (SELECT count(*) FROM directories)"
            ).fetchone()[0]
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return  # damaged, or not tierfs metadata: restore replaces it (it is kept aside)
    if used:
        raise StoreNotEmptyError(
            f"{path} is readable and names {used} segments and directories; "
            "restore only into a new data dir or over damaged metadata"
        )


def _fetch_newest_usable(objects: BackupObjects, staging: Path, lineage: Lineage) -> BackupManifest:
    manifests = objects.manifests()
    for manifest in manifests:
        if not lineage.holds(manifest.epoch, manifest.log_seq):
            continue  # another lineage's, or its parent's after the fork
        staging.unlink(missing_ok=True)
        if objects.download(manifest, staging) and _intact(staging):
            return manifest
        log.warning("metadata backup %s on %s is incomplete or damaged; trying an older one",
                    manifest.stem, objects.url)
    staging.unlink(missing_ok=True)
    raise NoMetadataBackupError(
        f"{objects.url} holds no usable metadata backup under _metadata/ "
        f"({len(manifests)} manifests found)"
    )


def _intact(path: Path) -> bool:
    try:
        db = sqlite3.connect(path)
        try:
            return bool(db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
        finally:
            db.close()
    except sqlite3.Error:
        path.unlink(missing_ok=True)
        return False


def _snapshot_epoch(path: Path) -> int:
    metadata = MetadataStore.sqlite(path)
    try:
        return metadata.load_store_record().epoch
    finally:
        metadata.close()


def _prepare(path: Path, epoch: int, tier2_identity: str, lineage_head: int) -> int:
    """Set the highest epoch seen, a journal checkpoint of 0 (recovery reads whatever
    journal the data dir has from its start), the tier-2 restored from and the lineage
    the next epoch continues; the number of segments."""
    metadata = MetadataStore.sqlite(path)
    try:
        record = metadata.load_store_record()
        metadata.save_store_record(dataclasses.replace(record, epoch=epoch, journal_checkpoint_lsn=0))
        metadata.mark_restored_from(lineage_head)
        metadata.bind_tier2(tier2_identity, rebind=True)
        return len(metadata.load_segments())
    finally:
        metadata.close()  # the last connection: SQLite checkpoints and removes the -wal


def _set_aside(data_dir: Path) -> tuple[str, ...]:
    """Rename the old metadata files out of the way (kept, not deleted); the journal
    stays, to be replayed."""
    stamp = now_ns()
    moved = []
    for name in (METADATA_FILE, f"{METADATA_FILE}-wal", f"{METADATA_FILE}-shm"):
        old = data_dir / name
        if old.exists():
            new = data_dir / f"{name}.before-restore-{stamp}"
            os.replace(old, new)
            moved.append(new.name)
    return tuple(moved)



