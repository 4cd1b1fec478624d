"""Opening a data dir (in a worker thread, with the data-dir lock held): the metadata
and a new owner epoch, the namespace, the chunk storage, journal recovery, and the
journal that continues where recovery ended.

Invariants:
- The epoch is claimed on tier-2 first (``ownership.claims.take_ownership``: exclusive,
  refused with ``OwnedElsewhereError`` if another owner holds tier-2, or this data dir
  is a copy of the one that does, and the config does not say ``takeover``), then
  committed locally before anything else, so every chunk this owner writes has a name
  no other owner, earlier or concurrent, used. Taking over from another data dir with
  the data dir's own (SQLite) metadata marks every earlier epoch as another lineage's
  (``foreign_below_epoch``): the orphan sweep keeps their objects.
- The metadata backup's seal is taken right before the epoch commit and, if it held,
  the backup adopted right after it, before any other commit (``backup.seal``).
- Recovery runs before the journal accepts a frame, and the new journal starts at the
  recovered end LSN; nothing after a torn frame is replayed, and a journal damaged
  before intact frames is refused (``JournalDamagedError``) unless the config asks
  for its repair (``tierfs fsck --repair``).
- A data dir whose own metadata is damaged, or missing while its journal or claim is
  there, is refused (``MetadataDamagedError``, naming ``tierfs restore``) before
  anything changes: never an empty store opened over its journal.
- The metadata is bound to one tier-2 (the first it was opened with): another is
  refused (``WrongTier2Error``) before anything is claimed or written.
- A full disk does not stop the open: the metadata releases the data dir's space
  reserve for the epoch commit (retried once); recovery only cuts and deletes.
- Memory stays bounded: recovered tails go through the shared tail budget.
- Nothing here grows with the number of segments: the table reads segment rows on
  demand (its own read connection), and recovery looks up only the segments the
  journal names.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url, redacted_url
from tierfs.contracts.errors import (
    InvalidArgumentError,
    MetadataDamagedError,
    NoSpaceError,
    WrongTier2Error,
)
from tierfs.contracts.reports.statistics import RecoveryReport
from tierfs.engine.backup import seal as backup_seal
from tierfs.engine.backup.metadata_backup import AdoptedBackup
from tierfs.engine.backup.objects import LineageLink
from tierfs.engine.journal.log import Journal
from tierfs.engine.metadata.database import POSTGRESQL, open_database
from tierfs.engine.metadata.replay import recreate_from_journal
from tierfs.engine.metadata.segment_rows import SegmentRowReader
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.claims import (
    OwnerClaim,
    OwnerClaims,
    Ownership,
    read_local_claim,
    take_ownership,
)
from tierfs.engine.ownership.epoch_guard import guard_epoch
from tierfs.engine.recovery.journal_repair import JournalRepair
from tierfs.engine.recovery.journal_replay import recover_journal
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail import TailBudget
from tierfs.engine.space_reserve import CLAIM_ROOM_BYTES, SpaceReserve
from tierfs.engine.tier2.chunk_storage import ChunkStorage, open_chunk_storage

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class OpenedDataDir:
    metadata: MetadataStore
    epoch: int
    chunk_storage: ChunkStorage
    journal: Journal
    recovery: RecoveryReport
    claim: OwnerClaim
    replayed: list[SegmentState]  # segments with unflushed bytes: the writer's backlog
    segment_rows: SegmentRowReader
    adopted_backup: AdoptedBackup | None  # the newest metadata backup is current (``backup.seal``)
    foreign_below_epoch: int  # objects of earlier epochs may be another data dir's (orphan sweep)
    lineage_link: LineageLink | None  # whose metadata this epoch continues (None: a shared database)


def open_data_dir(
    config: StoreConfig,
    table: SegmentTable,
    tail_budget: TailBudget,
    on_durable: Callable[[int], None],
    now_s: float,
    before_claim: Callable[[], None] | None = None,
) -> OpenedDataDir:
    """Blocking: give ``table`` the directories and a reader of segment rows (segments
    are loaded when first named), and fill the tails of the segments the journal holds
    unflushed bytes of; ``on_durable`` becomes the journal's callback for synced LSNs; replayed
    appends count as appended at ``now_s`` (the engine's monotonic clock, read by the
    caller on the event loop)."""
    data_dir = config.data_dir
    database = data_dir / "metadata.sqlite"
    local_metadata = not is_postgresql_url(config.metadata_url)
    if local_metadata:
        _refuse_lost_metadata(config, database)
    (data_dir / "journal").mkdir(parents=True, exist_ok=True, mode=0o700)
    space_reserve = SpaceReserve(data_dir)
    try:
        db = open_database(config.metadata_url, database, space_reserve)
    except sqlite3.DatabaseError as e:
        raise _damaged(config, database, e) from None
    try:
        if db.dialect == POSTGRESQL and db.execute("SELECT to_regclass('cluster')").fetchone()[0] is not None:
            raise InvalidArgumentError(  # before any table is created in the cluster's database
                f"{config.metadata_description} is a cluster's database: its daemons serve it "
                "(set containers as they do, and start tierfs serve --listen HOST:PORT)")
        metadata = MetadataStore(db)
        if local_metadata:
            metadata.load_store_record()  # a damaged file often reads its header and fails here
    except sqlite3.DatabaseError as e:
        db.close()
        raise _damaged(config, database, e) from None
    except BaseException:
        db.close()
        raise
    try:
        # one metadata, one tier-2: opening it on another would mix two stores' objects
        # (a command that forgot --tier2 would claim and write the data dir's own chunks/)
        given = redacted_url(config.chunk_store_url) if not local_metadata else config.tier2_identity
        bound = metadata.bind_tier2(given)
        if bound != given:
            raise WrongTier2Error(config.metadata_description, bound or f"{data_dir / 'chunks'} (its own)",
                                  given or f"{data_dir / 'chunks'} (its own)")
        space_reserve.release_if_free_below(CLAIM_ROOM_BYTES)
        chunk_storage = open_chunk_storage(
            config.chunk_store_url, config.chunk_store_options,
            read_deadline_per_mib_s=config.tier2_read_timeout_s,
        )
        ownership: Ownership = take_ownership(
            data_dir, OwnerClaims(chunk_storage), metadata.load_store_record().epoch, config.takeover,
            before_claim,
        )
    except BaseException:
        metadata.close()
        raise
    claim = ownership.claim
    sealed = local_metadata and backup_seal.take(database)
    # A shared database saw every commit of every owner (a fenced one commits nothing):
    # only a data dir's own metadata can miss another lineage's commits.
    foreign_before = local_metadata and not ownership.continued
    parent_epoch = metadata.parent_epoch()
    fork_seq = metadata.last_change_seq() if local_metadata else 0
    try:
        store_record = metadata.begin_epoch(at_least=claim.epoch, foreign_before=foreign_before)
    except NoSpaceError:  # the space reserve was released for this retry
        store_record = metadata.begin_epoch(at_least=claim.epoch, foreign_before=foreign_before)
    # before any other commit: the newest backup holds all but the epoch just committed
    adopted_backup = AdoptedBackup.open(database) if sealed else None
    epoch = store_record.epoch
    lineage_link = LineageLink(epoch, parent_epoch, fork_seq) if local_metadata else None
    guard_epoch(metadata, epoch)  # from now on a newer owner's epoch refuses our commits
    table.load_directories(metadata.load_directories())
    root = metadata.load_root_directory()
    # the root has no record of its own until a policy or an attribute is set on it:
    # it was created with the store
    table.root_directory = root if root.created_ns else dataclasses.replace(root, created_ns=store_record.created_ns)
    rows = SegmentRowReader(open_database(config.metadata_url, data_dir / "metadata.sqlite", event_loop_reads=True))
    try:
        table.attach(rows)
        report, replayed = recover_journal(
            data_dir / "journal",
            store_record.journal_checkpoint_lsn,
            table.segment_by_id,
            functools.partial(recreate_from_journal, metadata),
            tail_budget,
            config.max_append_bytes + 64,
            now_s=now_s,
            repair=JournalRepair(data_dir) if config.repair_journal else None,
        )
    except BaseException:
        rows.close()
        metadata.close()
        if adopted_backup is not None:
            adopted_backup.source.close()
        raise
    journal = Journal(
        data_dir / "journal",
        start_lsn=report.end_lsn,
        next_seq=report.next_seq,
        file_bytes=config.journal_file_bytes,
        vd_sync_interval_s=config.vd_sync_interval_s,
        on_durable=on_durable,
        space_reserve=space_reserve,
    )
    tail_budget.evict(journal.written_lsn)
    table.segment_count += report.segments_recreated
    if report.segments_recreated:
        log.warning("recovery: %d segment creations the metadata had not synced were put back from the journal",
                    report.segments_recreated)
    log.info(
        "opened %s epoch %d: %d segments, replayed %d appends (%d bytes), cut %d torn bytes",
        data_dir, epoch, table.segment_count, report.frames_replayed,
        report.bytes_replayed, report.torn_bytes_cut,
    )
    if report.damaged_stretches_moved or report.frames_moved:
        log.error("journal repair: %d damaged stretches and %d intact frames that could not follow them "
                  "moved to %s", report.damaged_stretches_moved, report.frames_moved, data_dir / "lost+found")
    return OpenedDataDir(metadata, epoch, chunk_storage, journal, report, claim, replayed, rows, adopted_backup,
                         store_record.foreign_below_epoch, lineage_link)


def _refuse_lost_metadata(config: StoreConfig, database: Path) -> None:
    """A data dir that held a store (its journal has frames, or it claimed tier-2) but
    has no ``metadata.sqlite``: opening would start an empty store over its journal."""
    if database.exists():
        return
    journal = config.data_dir / "journal"
    has_frames = journal.is_dir() and any(p.stat().st_size for p in journal.glob("*.jnl"))
    if has_frames or read_local_claim(config.data_dir) is not None:
        raise MetadataDamagedError(str(database), "missing (the data dir's journal and claim are there)",
                                   str(config.data_dir), config.tier2_url or config.chunk_store_url)


def _damaged(config: StoreConfig, database: Path, error: sqlite3.DatabaseError) -> MetadataDamagedError:
    return MetadataDamagedError(str(database), f"damaged ({error})", str(config.data_dir),
                                config.tier2_url or config.chunk_store_url)
