"""Rebuilding a data dir's metadata from the backups on tier-2 (``tierfs restore``).

Steps: refuse a data dir whose metadata still names segments; set a damaged
``metadata.sqlite`` and an old journal aside (renamed, never deleted); take the newest
manifest on tier-2 whose snapshot downloads with the right size and CRC32C and passes
SQLite's integrity check (older ones are tried in turn); raise the store record's
epoch to the highest epoch that tier-2 shows any owner used (the snapshot's, the
backups' names, the chunk names), so that the next open's new epoch is above all of
them; install the file as ``metadata.sqlite``.

Invariants:
- Nothing in the data dir changes before a usable snapshot is on local disk; the
  restored database appears under its final name by one rename.
- Restore only reads tier-2: it writes no object, so a failed restore changes nothing
  there, and running it again is safe.
- Bytes that never reached tier-2 (the old journal's unflushed tail) are not restored;
  the old journal is kept aside for inspection.
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
from tierfs.engine.backup_objects import BackupManifest, BackupObjects
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.metadata import MetadataStore, now_ns
from tierfs.engine.ownership import DataDirLock

log = logging.getLogger(__name__)

METADATA_FILE = "metadata.sqlite"
_CHUNK_EPOCH = re.compile(r"^(?:s\d+/e(\d+)-c\d+|packs/e(\d+)-[0-9a-f]{32})")  # a chunk or a pack


@dataclasses.dataclass(frozen=True)
class RestoredMetadata:
    manifest: BackupManifest
    segments: int
    highest_epoch_seen: int
    set_aside: tuple[str, ...]  # what was renamed out of the way in the data dir


def restore_metadata(
    data_dir: Path, tier2_url: str, storage_options: Mapping[str, Any] | None = None
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
        manifest = _fetch_newest_usable(objects, staging)
        epoch = max(
            _snapshot_epoch(staging), objects.highest_epoch(),
            max((int(m.group(1) or m.group(2)) for n in objects.chunk_names() if (m := _CHUNK_EPOCH.match(n))),
                default=0),
        )
        segments = _prepare(staging, epoch)
        set_aside = _set_aside(data_dir)
        os.replace(staging, data_dir / METADATA_FILE)
        fsync_directory(data_dir)
    finally:
        lock.release()
    log.info("restored %s from backup %s of %s (highest epoch seen %d)",
             data_dir, manifest.stem, tier2_url, epoch)
    return RestoredMetadata(manifest, segments, epoch, set_aside)


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


def _fetch_newest_usable(objects: BackupObjects, staging: Path) -> BackupManifest:
    manifests = objects.manifests()
    for manifest in manifests:
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


def _prepare(path: Path, epoch: int) -> int:
    """Set the highest epoch seen and a journal checkpoint of 0 (the data dir gets a new,
    empty journal); the number of segments."""
    metadata = MetadataStore.sqlite(path)
    try:
        record = metadata.load_store_record()
        metadata.save_store_record(dataclasses.replace(record, epoch=epoch, journal_checkpoint_lsn=0))
        return len(metadata.load_segments())
    finally:
        metadata.close()  # the last connection: SQLite checkpoints and removes the -wal


def _set_aside(data_dir: Path) -> tuple[str, ...]:
    """Rename the old metadata files and journal out of the way (kept, not deleted)."""
    stamp = now_ns()
    moved = []
    for name in (METADATA_FILE, f"{METADATA_FILE}-wal", f"{METADATA_FILE}-shm", "journal"):
        old = data_dir / name
        if old.exists():
            new = data_dir / f"{name}.before-restore-{stamp}"
            os.replace(old, new)
            moved.append(new.name)
    return tuple(moved)



