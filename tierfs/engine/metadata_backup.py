"""Continuous backup of the metadata database into tier-2 (``_metadata/``).

A cycle asks SQLite whether the metadata changed since the last backup (``PRAGMA
data_version`` on a connection of its own); if so it copies a consistent snapshot with
SQLite's online backup API into a temporary file in the data dir, uploads it under a new
name, then its manifest (``backup_objects``), and prunes old backups. When the store
cancels the task, after its last flush, it runs one more cycle (bounded in time).

How often (each upload is the whole database, so cycles are rate-limited):
- a change that a ``tier2`` append's promise rests on (``request_soon``: the storage
  writer committed a flush of a ``tier2`` segment) is backed up within ``interval_s``
  (the flush interval, at least ``MIN_INTERVAL_S``);
- any other change within ``relaxed_interval_s`` (``RELAXED_INTERVAL_FLUSHES`` flush
  intervals: 10 s by default): a restore after losing the data dir may lose that much
  more of ``pd``/``vd`` data (flushed, not yet backed up) and of namespace changes on
  top of the journal's unflushed bytes, which the host's loss takes anyway;
- never more than ``COST_SPACING`` times the last cycle's duration after it ended, so
  backing up takes at most 1/(1 + ``COST_SPACING``) of the time and of tier-2's
  bandwidth whatever the database's size; the bounds above stretch to that spacing.

Invariants:
- A snapshot is crash-consistent: the backup API reads one committed state (a WAL read
  transaction), whatever the store commits meanwhile, and the store's own connection
  is never used, so metadata commits and appends never wait for a backup.
- The newest backup on tier-2 is behind the metadata by at most the bound above plus
  one cycle; a failed cycle (tier-2 down, disk full) is logged, counted and retried at
  the next interval with the change still pending.
- A fenced store (another owner claimed tier-2) uploads and prunes nothing more.
- Nothing is uploaded when nothing changed; memory does not grow with the database
  (page-by-page copy to a file, streamed upload). That holds across a clean restart
  too: the seal (``backup_seal``, ``seal`` and ``AdoptedBackup``) tells the next open
  that the newest backup holds everything but the epoch it commits.
- Times are on the engine's monotonic clock (``clock.monotonic_s``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import TierFSError
from tierfs.engine import backup_seal
from tierfs.engine.backup_objects import BackupManifest, BackupObjects, file_crc32c
from tierfs.engine.clock import monotonic_s
from tierfs.engine.metadata import now_ns

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "metadata.backup.tmp"  # in the data dir, replaced by every cycle
# Backups follow the flush interval but run at most this often: with the tests' 50 ms
# flush interval every flush would otherwise upload a whole database.
MIN_INTERVAL_S = 0.25
# Changes no tier2 append waits on are backed up this many flush intervals apart: an
# upload of a database of 10,000 small files' records every second sent ~170 MiB to S3
# for ~10 MB of data (docs/PERFORMANCE.md, Small files).
RELAXED_INTERVAL_FLUSHES = 10
# A cycle starts no sooner than this many times the last one's duration after it
# ended: backups take at most a tenth of the time, however large the database grows.
COST_SPACING = 9.0
SHUTDOWN_CYCLE_S = 10.0  # a clean shutdown waits this long at most for its last backup


class MetadataBackup:
    """Backs up ``database`` into ``objects`` under the owner's ``epoch``."""

    def __init__(self, database: Path, objects: BackupObjects, epoch: int, interval_s: float,
                 still_owner: Callable[[], bool] = lambda: True, relaxed_interval_s: float | None = None,
                 adopted: AdoptedBackup | None = None) -> None:
        self.database = database
        self._still_owner = still_owner  # a fenced store backs up (and prunes) nothing more
        self.objects = objects
        self.epoch = epoch
        self.interval_s = interval_s  # a change a tier2 append waits on (request_soon)
        self.relaxed_interval_s = max(interval_s, relaxed_interval_s or interval_s)  # any other change
        self._soon = trio.Event()  # request_soon since the last cycle's snapshot
        self.last_cycle_s = 0.0  # how long the last cycle that uploaded took
        self.backups_taken = 0
        self.failures = 0
        self.last_manifest: BackupManifest | None = None
        self._source: sqlite3.Connection | None = None
        self._backed_up_version: int | None = None  # data_version of the last snapshot
        if adopted is not None:  # the newest backup holds the database but for our epoch
            self._source, self._backed_up_version = adopted.source, adopted.data_version
        self._left_behind = False  # the shutdown cycle's thread may still use the source
        self._seq = 0
        self._cycle_lock = trio.Lock()  # the periodic and the shutdown cycle never overlap

    @classmethod
    def for_store(cls, config: StoreConfig, epoch: int, still_owner: Callable[[], bool] = lambda: True,
                  adopted: AdoptedBackup | None = None) -> MetadataBackup:
        """The backup of ``config``'s store into its tier-2, as owner ``epoch`` while
        ``still_owner()``; ``adopted``: what the open found already backed up."""
        objects = BackupObjects(config.chunk_store_url, config.chunk_store_options)
        interval_s = max(config.flush_interval_s, MIN_INTERVAL_S)
        return cls(config.data_dir / "metadata.sqlite", objects, epoch, interval_s, still_owner,
                   relaxed_interval_s=RELAXED_INTERVAL_FLUSHES * interval_s, adopted=adopted)

    def seal(self) -> None:
        """After the store closed its own connections (every shutdown): when the newest
        backup holds the database as it is (no commit since the last snapshot or the
        adoption), close this connection too and write the seal (``backup_seal``)."""
        source, self._source = self._source, None
        if source is None or self._left_behind:  # left behind: its thread may still use it
            return
        try:
            version = int(source.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            version = None
        source.close()  # the last connection: SQLite checkpoints and removes the log now
        if version is not None and version == self._backed_up_version and self._still_owner():
            backup_seal.write(self.database)

    def request_soon(self) -> None:
        """A commit a ``tier2`` append waits on: back it up within ``interval_s``
        (on the event loop)."""
        self._soon.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                self._soon = trio.Event()  # the snapshot below covers what was asked so far
                started_s = monotonic_s()
                if await self.cycle():
                    self.last_cycle_s = monotonic_s() - started_s
                spacing_s = COST_SPACING * self.last_cycle_s
                await trio.sleep(max(self.interval_s, spacing_s))
                with trio.move_on_after(max(self.relaxed_interval_s, spacing_s) - max(self.interval_s, spacing_s)):
                    await self._soon.wait()
        finally:
            # The store cancels this task after its last flush (clean shutdown): one
            # more cycle then covers those flushes, if tier-2 answers in time.
            with trio.CancelScope(shield=True):
                await self.cycle(timeout_s=SHUTDOWN_CYCLE_S)
            if self._left_behind:
                # not closed here: the abandoned cycle's thread may still use it; CPython
                # closes it when that thread lets go of it (``seal`` closes it otherwise)
                self._source = None

    async def cycle(self, timeout_s: float = math.inf) -> bool:
        """Back up if the metadata changed; True if a backup was uploaded. Never raises
        for a tier-2 or disk failure: it is logged and retried next cycle.

        Cancelling a cycle waits for its thread, so two cycles never share the
        connection or the snapshot file. Only a cycle with a ``timeout_s`` (the last one,
        at shutdown, when nothing follows it) leaves its thread behind when time is up,
        to finish or fail on its own."""
        with trio.move_on_after(timeout_s):
            async with self._cycle_lock:
                try:
                    return await trio.to_thread.run_sync(
                        self._cycle_blocking, abandon_on_cancel=timeout_s != math.inf
                    )
                except (TierFSError, OSError, sqlite3.Error) as e:
                    self.failures += 1
                    log.warning("metadata backup to %s failed (retried in %.1f s): %s",
                                self.objects.url, self.interval_s, e)
                    return False
        self.failures += 1
        self._left_behind = True
        log.warning("metadata backup to %s did not finish within %.0f s; left behind",
                    self.objects.url, timeout_s)
        return False

    def _cycle_blocking(self) -> bool:
        if self._source is None:
            self._source = sqlite3.connect(self.database, check_same_thread=False)
        source = self._source
        version = int(source.execute("PRAGMA data_version").fetchone()[0])
        if version == self._backed_up_version or not self._still_owner():
            return False
        snapshot = self.database.parent / SNAPSHOT_FILE
        try:
            write_snapshot(source, snapshot)
            size_bytes, crc = file_crc32c(snapshot)
            self._seq += 1
            manifest = BackupManifest(self.epoch, self._seq, size_bytes, crc, now_ns())
            self.objects.upload(snapshot, manifest)
        finally:
            snapshot.unlink(missing_ok=True)
        self._backed_up_version = version
        self.last_manifest = manifest
        self.backups_taken += 1
        if self._still_owner():  # checked again: a takeover may have come meanwhile
            self.objects.prune()
        return True


@dataclasses.dataclass(frozen=True)
class AdoptedBackup:
    """A connection opened right after the open's epoch commit, and its data_version
    then: the newest backup holds everything before (``backup_seal.take`` said so)."""

    source: sqlite3.Connection
    data_version: int

    @classmethod
    def open(cls, database: Path) -> AdoptedBackup:
        source = sqlite3.connect(database, check_same_thread=False)
        return cls(source, int(source.execute("PRAGMA data_version").fetchone()[0]))


def write_snapshot(source: sqlite3.Connection, target: Path) -> None:
    """A consistent copy of ``source``'s database as one self-contained file."""
    target.unlink(missing_ok=True)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
        copy.execute("PRAGMA journal_mode=DELETE")  # no -wal file next to the snapshot
    finally:
        copy.close()
