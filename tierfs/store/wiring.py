"""Building the store's parts once its data dir is open: each part gets the narrow
objects it needs (its ports), never the façade.

Invariants:
- Every part that writes or deletes on tier-2 gets the fenced chunk storage
  (``OwnerFence.guarded_storage``): writes are refused once another owner claimed
  tier-2, deletes happen only after a fresh look at the claims.
- Bytes recovered from the journal but not yet in tier-2 are handed to the storage
  writer before anything starts, so the backlog counts them.
- The appender acknowledges only under the store's tenure: its fence and, in cluster
  mode, its container's lease (``engine/ownership/tenure.py``).
- With SQLite metadata, a ``tier2`` append is acknowledged, and a journal file deleted,
  only once the metadata changes before it are shipped to tier-2 (a restore finds them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url
from tierfs.engine.appender import Appender
from tierfs.engine.backup.metadata_backup import MetadataBackup
from tierfs.engine.clock import WallClock
from tierfs.engine.flush.storage_writer import StorageWriter
from tierfs.engine.ownership.fencing import OwnerFence
from tierfs.engine.ownership.tenure import Lease, Tenure
from tierfs.engine.read.block_cache import BlockCache
from tierfs.engine.read.block_source import BlockSource
from tierfs.engine.read.reader import Reader
from tierfs.engine.recovery.lost_found import LostFound
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.growth import GrowthNotifier
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail import TailBudget
from tierfs.engine.segments.tail_reader import TailReader
from tierfs.engine.upkeep.defrag import Defragmenter
from tierfs.engine.upkeep.garbage import GarbageCollector
from tierfs.engine.upkeep.orphans import OrphanSweeper
from tierfs.engine.upkeep.removals import RemovalLog
from tierfs.offload.longterm import LongTermStore
from tierfs.offload.offloader import Offloader
from tierfs.offload.reads import LongTermReads
from tierfs.offload.scheduler import PolicyScheduler
from tierfs.store.concat import Concatenator
from tierfs.store.namespace import Namespace
from tierfs.store.opening import OpenedDataDir
from tierfs.store.policies import PolicyBook

BackgroundTask = Callable[..., Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Shared:
    """What the façade holds from the start, before the data dir is open."""

    config: StoreConfig
    table: SegmentTable
    tail_budget: TailBudget
    appender: Appender
    growth: GrowthNotifier
    long_term: LongTermStore | None
    clock: WallClock
    limiter: trio.CapacityLimiter
    lease: Lease | None  # cluster mode: the container's lease (engine/ownership/tenure.py)


@dataclasses.dataclass
class Parts:
    fence: OwnerFence
    catalogue: ChunkCatalogue
    garbage: GarbageCollector
    writer: StorageWriter
    blocks: BlockSource
    long_term_reads: LongTermReads | None
    reader: Reader
    offloader: Offloader
    orphans: OrphanSweeper
    namespace: Namespace
    concat: Concatenator
    policies: PolicyBook
    scheduler: PolicyScheduler
    defragmenter: Defragmenter
    metadata_backup: MetadataBackup | None  # SQLite only: PostgreSQL keeps its own backups

    def background_tasks(self) -> tuple[BackgroundTask, ...]:
        """Started in this order after the journal's loop, cancelled at shutdown."""
        backup = () if self.metadata_backup is None else (self.metadata_backup.run,)
        return (self.writer.run, self.offloader.run, self.scheduler.run, self.orphans.run,
                self.defragmenter.run, self.fence.run, *backup)

    def chunk_storage_holders(self) -> tuple[Any, ...]:
        """Every part holding the chunk storage (tests swap it on an open store)."""
        return (self.blocks, self.writer, self.offloader, self.garbage, self.orphans, self.defragmenter)


def build_parts(shared: Shared, opened: OpenedDataDir) -> Parts:
    config, table, limiter, long_term = shared.config, shared.table, shared.limiter, shared.long_term
    epoch, journal = opened.epoch, opened.journal
    fence = OwnerFence(opened.claim, opened.chunk_storage, limiter, config)
    fence.shared_below_epoch = opened.foreign_below_epoch
    chunk_storage = fence.guarded_storage(long_term)
    catalogue = ChunkCatalogue(opened.metadata, opened.segment_rows)
    removals = RemovalLog()  # deletes that a metadata commit follows, for the orphan sweep
    garbage = GarbageCollector(catalogue, chunk_storage, limiter, long_term, removals)
    tail = TailReader(journal)
    writer = StorageWriter(config, epoch, chunk_storage, limiter, catalogue, tail, shared.tail_budget,
                           journal, garbage, fence)
    shared.appender.attach(journal, writer, Tenure(fence, shared.lease))
    for seg in opened.replayed:  # the backlog holds them from now on
        if seg.appended_length > seg.flushed_length:
            writer.appended(seg, seg.appended_length - seg.flushed_length)
    long_term_reads = LongTermReads(long_term, limiter) if long_term else None
    blocks = BlockSource(BlockCache(config.block_cache_bytes), chunk_storage, limiter, long_term_reads)
    fence.on_fenced = LostFound(config.data_dir, epoch, table, tail, journal).save
    flush_one = writer.sync_and_flush_one
    offloader = Offloader(config, long_term, chunk_storage, limiter, catalogue, table.segment_by_id,
                          flush_one, shared.clock, removals)
    defragmenter = Defragmenter(config, epoch, chunk_storage, limiter, catalogue, garbage, writer.wake,
                                table.walk, table.segment_by_id)
    orphans = OrphanSweeper(config, epoch, catalogue, chunk_storage, long_term.storage if long_term else None,
                            offloader.uploading, limiter, shared.clock, removals,
                            packs_in_flight=writer.packs_in_flight, merging=defragmenter.merging,
                            foreign_below_epoch=opened.foreign_below_epoch)
    policies = PolicyBook(table, catalogue, garbage)
    scheduler = PolicyScheduler(offloader, catalogue, policies.segments_with_policy, policies.truncate_head,
                                shared.clock, config.policy_interval_s)
    policies.on_change = scheduler.wake
    metadata_backup = (None if is_postgresql_url(config.metadata_url)
                       else MetadataBackup.for_store(config, epoch, still_owner=fence.still_owner,
                                                     adopted=opened.adopted_backup,
                                                     known_fenced=lambda: fence.fenced,
                                                     prune_log=catalogue.prune_change_log,
                                                     lineage_link=opened.lineage_link))
    if metadata_backup is not None:
        # what a restore needs is on tier-2 before a tier2 append is acknowledged and
        # before the journal lets go of a file or garbage is deleted (engine/backup/metadata_backup.py)
        shared.appender.ship_metadata = writer.before_journal_delete = metadata_backup.ship_changes
        garbage.before_delete = metadata_backup.ship_changes
    return Parts(
        fence=fence, catalogue=catalogue, garbage=garbage, writer=writer, blocks=blocks,
        long_term_reads=long_term_reads, reader=Reader(catalogue, blocks, tail), offloader=offloader,
        orphans=orphans,
        namespace=Namespace(config, table, catalogue, writer, shared.tail_budget, garbage,
                            shared.growth.names_changed, journal,
                            lambda directory: bool(policies.effective_policy(directory).rewrite_replaces)),
        concat=Concatenator(table, catalogue, offloader, flush_one, shared.growth.notify,
                            shared.growth.names_changed),
        policies=policies, scheduler=scheduler,
        defragmenter=defragmenter,
        metadata_backup=metadata_backup,
    )
