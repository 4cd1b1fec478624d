"""Continuous backup of the metadata database into tier-2 (``_metadata/``): whole
snapshots now and then, and every change in between, shipped within a flush interval.

A *cycle* asks SQLite whether the metadata changed since the last snapshot (``PRAGMA
data_version`` on a connection of its own); if so it copies a consistent snapshot with
SQLite's online backup API into a temporary file in the data dir, uploads it under a new
name, then its manifest (``backup.objects``), and prunes old backups. Each upload is the
whole database, so cycles run every ``relaxed_interval_s`` (``RELAXED_INTERVAL_FLUSHES``
flush intervals) at most, and never more than ``COST_SPACING`` times the last cycle's
duration after it ended: snapshots take at most 1/(1 + ``COST_SPACING``) of the time and
of tier-2's bandwidth, whatever the database's size. Once this lineage has a snapshot
(taken by this opening, or adopted), a cycle takes a new one only after
``SNAPSHOT_AFTER_CHANGES`` changes or ``SNAPSHOT_MAX_AGE_S``: the shipped changes hold
the rest, and they bound how many a restore applies.

A *shipment* (``ship_changes``) uploads every change logged since the last one
(``metadata.change_log``: the rows as they are now, one small object) and then lets the store
prune the log. One runs every ``interval_s`` (the flush interval) when anything
changed, so a restore brings back every change older than a flush interval; and one is
awaited before a ``tier2`` append is acknowledged, before ``flush`` returns and before
the journal deletes a file or garbage is deleted (``Appender``, ``SegmentStore.flush``,
``StorageWriter.before_journal_delete``, ``GarbageCollector.before_delete``), so a
restore brings back every byte whose flush returned, finds in the journal every byte
that a shipment does not hold, and never references an object that was deleted.
When the store cancels the task, after its last flush, it ships and runs one more cycle
(bounded in time).

Invariants:
- A snapshot is crash-consistent: the backup API reads one committed state (a WAL read
  transaction), whatever the store commits meanwhile, and the store's own connection
  is never used, so metadata commits and appends never wait for a backup.
- The newest snapshot plus the shipped changes after it are behind the metadata by at
  most one flush interval plus one shipment; a failed cycle or shipment (tier-2 down,
  disk full) is logged, counted and retried at the next interval with the change still
  pending, and a shipment an acknowledgement waits for is retried until it succeeds.
- A fenced store (another owner claimed tier-2) uploads and prunes nothing more.
- Shipments are joined: a caller waits for one that started after its call (which
  holds every change committed before it), so concurrent callers cost one upload.
- Nothing is uploaded when nothing changed; memory does not grow with the database
  (page-by-page copy to a file, streamed upload). That holds across a clean restart
  too: the seal (``backup.seal``, ``seal`` and ``AdoptedBackup``) tells the next open
  that the newest backup holds everything but the epoch it commits.
- Times are on the engine's monotonic clock (``clock.monotonic_s``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import TierFSError
from tierfs.engine.backup import seal as backup_seal
from tierfs.engine.backup.objects import (
    BackupManifest,
    BackupObjects,
    LineageLink,
    LogObject,
    file_crc32c,
)
from tierfs.engine.clock import monotonic_s, now_ns
from tierfs.engine.metadata.change_log import CHANGE_LOG, encode, last_logged_seq, read_changes

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
# A shipment holds at most this many changed rows (a burst of creates ships in several).
SHIP_MAX_ROWS = 20_000
SHIP_RETRY_INITIAL_S, SHIP_RETRY_MAX_S = 0.1, 5.0  # a shipment an acknowledgement waits for
# A new snapshot once this many changes followed the last, or it is this old: a restore
# then downloads and applies at most about that many (one object per flush interval).
SNAPSHOT_AFTER_CHANGES = 10_000
SNAPSHOT_MAX_AGE_S = 3600.0


class MetadataBackup:
    """Backs up ``database`` into ``objects`` under the owner's ``epoch``."""

    def __init__(self, database: Path, objects: BackupObjects, epoch: int, interval_s: float,
                 still_owner: Callable[[], bool] = lambda: True, relaxed_interval_s: float | None = None,
                 adopted: AdoptedBackup | None = None, known_fenced: Callable[[], bool] = lambda: False,
                 prune_log: Callable[[int], Awaitable[None]] | None = None,
                 lineage_link: LineageLink | None = None) -> None:
        self.database = database
        # where this epoch's metadata came from, on tier-2 before any other object of it
        self._lineage_link = lineage_link
        self._link_lock = threading.Lock()
        self._still_owner = still_owner  # a fenced store backs up (and prunes) nothing more
        self._known_fenced = known_fenced  # the same, without a look at tier-2 (shipments)
        self._prune_log = prune_log  # the store forgets shipped changes (its connection writes)
        self.objects = objects
        self.epoch = epoch
        self.interval_s = interval_s  # how often changes are shipped
        self.relaxed_interval_s = max(interval_s, relaxed_interval_s or interval_s)  # snapshots
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
        self._shipper: sqlite3.Connection | None = None  # shipments read changes on this connection
        self._ship_lock = trio.Lock()
        self._ship_asked = 0  # shipments asked for, and the asks the last started one covers
        self._ship_covered = 0
        self.shipped_seq = 0  # the last change on tier-2 (0: none yet from this opening)
        self.shipments = 0
        # the newest snapshot of this lineage: the last change it holds, and when (None:
        # none yet, so the next cycle takes one)
        self._snapshot_log_seq: int | None = None
        self._snapshot_at_s = 0.0
        self._adopted = adopted is not None

    @classmethod
    def for_store(cls, config: StoreConfig, epoch: int, still_owner: Callable[[], bool] = lambda: True,
                  adopted: AdoptedBackup | None = None, known_fenced: Callable[[], bool] = lambda: False,
                  prune_log: Callable[[int], Awaitable[None]] | None = None,
                  lineage_link: LineageLink | None = None) -> MetadataBackup:
        """The backup of ``config``'s store into its tier-2, as owner ``epoch`` while
        ``still_owner()``; ``adopted``: what the open found already backed up."""
        objects = BackupObjects(config.chunk_store_url, config.chunk_store_options)
        interval_s = max(config.flush_interval_s, MIN_INTERVAL_S)
        return cls(config.data_dir / "metadata.sqlite", objects, epoch, interval_s, still_owner,
                   relaxed_interval_s=RELAXED_INTERVAL_FLUSHES * interval_s, adopted=adopted,
                   known_fenced=known_fenced, prune_log=prune_log, lineage_link=lineage_link)

    def seal(self) -> None:
        """After the store closed its own connections (every shutdown): when tier-2 holds
        the database as it is (no commit since the last snapshot or the adoption, or
        every change since shipped), close this connection too and write the seal
        (``backup.seal``)."""
        if self._shipper is not None:
            self._shipper.close()
            self._shipper = None
        source, self._source = self._source, None
        if source is None or self._left_behind:  # left behind: its thread may still use it
            return
        try:
            version = int(source.execute("PRAGMA data_version").fetchone()[0])
            unshipped = int(source.execute(f"SELECT count(*) FROM {CHANGE_LOG} WHERE seq > ?",
                                           (self.shipped_seq,)).fetchone()[0])
        except sqlite3.Error:
            version, unshipped = None, 1
        source.close()  # the last connection: SQLite checkpoints and removes the log now
        current = version == self._backed_up_version or (self._snapshot_log_seq is not None and not unshipped)
        if version is not None and current and self._still_owner():
            backup_seal.write(self.database)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        next_cycle_s = monotonic_s()  # a first snapshot at once
        try:
            while True:
                if monotonic_s() >= next_cycle_s:
                    started_s = monotonic_s()
                    if await self.cycle():
                        self.last_cycle_s = monotonic_s() - started_s
                    next_cycle_s = monotonic_s() + max(self.relaxed_interval_s, COST_SPACING * self.last_cycle_s)
                try:
                    await self._ship_once()
                except (TierFSError, OSError, sqlite3.Error) as e:
                    self.failures += 1
                    log.warning("shipping metadata changes to %s failed (retried in %.1f s): %s",
                                self.objects.url, self.interval_s, e)
                await trio.sleep(self.interval_s)
        finally:
            # The store cancels this task after its last flush (clean shutdown): one
            # more shipment and cycle then cover those flushes, if tier-2 answers in time.
            with trio.CancelScope(shield=True):
                with trio.move_on_after(SHUTDOWN_CYCLE_S):
                    try:
                        await self._ship_once()
                    except (TierFSError, OSError, sqlite3.Error) as e:
                        self.failures += 1
                        log.warning("shipping metadata changes at shutdown failed: %s", e)
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

    async def ship_changes(self) -> None:
        """Return once every change committed before the call is on tier-2, retrying a
        failed shipment with backoff (an acknowledgement waits for it); nothing for a
        fenced store."""
        delay_s = SHIP_RETRY_INITIAL_S
        while True:
            try:
                await self._ship_once()
                return
            except (TierFSError, OSError, sqlite3.Error) as e:
                self.failures += 1
                log.warning("shipping metadata changes to %s failed (retried in %.1f s): %s",
                            self.objects.url, delay_s, e)
            await trio.sleep(delay_s)
            delay_s = min(2 * delay_s, SHIP_RETRY_MAX_S)

    async def _ship_once(self) -> None:
        """One shipment that started after this call (joining one if it did)."""
        self._ship_asked += 1
        asked = self._ship_asked
        async with self._ship_lock:
            if self._ship_covered >= asked:
                return  # a shipment that started after the call has ended
            self._ship_covered = self._ship_asked
            shipped = await trio.to_thread.run_sync(self._ship_blocking)
            # pruned under the lock: a caller that joins or follows this shipment returns
            # only once what it shipped is also gone from the local log
            if shipped and self._prune_log is not None and not self._known_fenced():
                await self._prune_log(shipped)

    def _ship_blocking(self) -> int:
        """Upload the changes after ``shipped_seq`` (in batches); the last one shipped (0: none)."""
        if self._shipper is None:
            self._shipper = sqlite3.connect(self.database, check_same_thread=False)
        shipped = 0
        while not self._known_fenced():
            self._link_lineage()
            batch = read_changes(self._shipper, self.shipped_seq, SHIP_MAX_ROWS)
            if batch is None:
                break
            self.objects.upload_log(LogObject(self.epoch, batch.first_seq, batch.last_seq), encode(batch))
            self.shipped_seq = shipped = batch.last_seq
            self.shipments += 1
        return shipped

    def _link_lineage(self) -> None:
        """Before this epoch's first snapshot or shipment (both threads wait for it)."""
        with self._link_lock:
            if self._lineage_link is not None:
                self.objects.upload_lineage(self._lineage_link)
                self._lineage_link = None

    def _cycle_blocking(self) -> bool:
        if self._source is None:
            self._source = sqlite3.connect(self.database, check_same_thread=False)
        source = self._source
        version = int(source.execute("PRAGMA data_version").fetchone()[0])
        if version == self._backed_up_version or not self._still_owner():
            return False
        self._link_lineage()
        if self._adopted and self._snapshot_log_seq is None:
            lineage = self.objects.lineage()  # this epoch's link is on tier-2 by now
            newest = [m for m in self.objects.manifests() if lineage.holds(m.epoch, m.log_seq)]
            if newest:  # the seal said the newest snapshot is this lineage's, and current
                self._snapshot_log_seq = newest[0].log_seq
                self._snapshot_at_s = time.monotonic() - max(0.0, (now_ns() - newest[0].created_ns) / 1e9)
        if self._snapshot_log_seq is not None:
            changes = last_logged_seq(source) - self._snapshot_log_seq
            if changes < SNAPSHOT_AFTER_CHANGES and time.monotonic() - self._snapshot_at_s < SNAPSHOT_MAX_AGE_S:
                return False  # the shipped changes hold them
        snapshot = self.database.parent / SNAPSHOT_FILE
        try:
            write_snapshot(source, snapshot)
            size_bytes, crc = file_crc32c(snapshot)
            self._seq += 1
            manifest = BackupManifest(self.epoch, self._seq, size_bytes, crc, now_ns(), _logged_seq(snapshot))
            self.objects.upload(snapshot, manifest)
        finally:
            snapshot.unlink(missing_ok=True)
        self._backed_up_version = version
        self._snapshot_log_seq, self._snapshot_at_s = manifest.log_seq, time.monotonic()
        self.last_manifest = manifest
        self.backups_taken += 1
        if self._still_owner():  # checked again: a takeover may have come meanwhile
            self.objects.prune()
        return True


@dataclasses.dataclass(frozen=True)
class AdoptedBackup:
    """A connection opened right after the open's epoch commit, and its data_version
    then: the newest backup holds everything before (``backup.seal.take`` said so)."""

    source: sqlite3.Connection
    data_version: int

    @classmethod
    def open(cls, database: Path) -> AdoptedBackup:
        source = sqlite3.connect(database, check_same_thread=False)
        return cls(source, int(source.execute("PRAGMA data_version").fetchone()[0]))


def _logged_seq(snapshot: Path) -> int:
    """The last change the snapshot holds (its change log's counter)."""
    db = sqlite3.connect(snapshot)
    try:
        return last_logged_seq(db)
    finally:
        db.close()


def write_snapshot(source: sqlite3.Connection, target: Path) -> None:
    """A consistent copy of ``source``'s database as one self-contained file."""
    target.unlink(missing_ok=True)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
        copy.execute("PRAGMA journal_mode=DELETE")  # no -wal file next to the snapshot
    finally:
        copy.close()
