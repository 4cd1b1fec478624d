"""The backup seal, ``<data_dir>/metadata.backup-seal``: what lets an open skip the
metadata backup a previous owner already took.

Every open commits a new owner epoch, and the metadata backup (``backup.metadata_backup``)
snapshots and uploads the whole database when it changed, so without the seal every
open would upload it again: 132 MiB at a million segments, at every restart. A clean
shutdown whose newest backup holds the database as it is writes the seal once every
connection to the database is closed: the identity of ``metadata.sqlite`` and of its
write-ahead log (size, modification and change times in ns, inode). The next open takes
the seal right before it commits its epoch: when the files still match, the newest
backup holds every change the database has but that epoch, and the backup's first
cycle starts from there instead of from nothing.

Invariants:
- The seal is removed by ``take``, whether it matches or not, before the open commits
  anything: a store that crashes later leaves no seal, and its next open backs up.
- A seal matches only files that no commit, checkpoint, migration or copy touched since
  it was written: any of them changes the log's size or the database file's times or
  inode. A seal that cannot be read is no seal.
- What a seal exempts is only the owner epoch: ``backup.restore`` raises a restored
  store's epoch above every epoch any owner used, whatever the backup held.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SEAL_FILE = "metadata.backup-seal"
_WAL_SUFFIX = "-wal"


def _identity(database: Path) -> dict[str, int]:
    stat = os.stat(database)
    try:
        wal_bytes = os.stat(f"{database}{_WAL_SUFFIX}").st_size
    except FileNotFoundError:
        wal_bytes = 0  # SQLite deletes an empty log when the last connection closes
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
            "inode": stat.st_ino, "wal_bytes": wal_bytes}


def write(database: Path) -> None:
    """Record ``database``'s files as the newest backup holds them (every connection to
    it closed). Best effort: without a seal the next open backs up again."""
    seal = database.parent / SEAL_FILE
    temporary = seal.with_suffix(".tmp")
    try:
        temporary.write_text(json.dumps(_identity(database)))
        os.replace(temporary, seal)
    except OSError as e:
        log.info("metadata backup: no seal written (%s); the next open backs up again", e)


def take(database: Path) -> bool:
    """Whether the seal matches ``database``'s files now; the seal is gone either way."""
    seal = database.parent / SEAL_FILE
    try:
        recorded = json.loads(seal.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        recorded = None
    try:
        matches = bool(recorded == _identity(database))
    except OSError:
        matches = False
    try:
        seal.unlink()
    except FileNotFoundError:
        pass
    return matches
