"""Collecting ``StoreStatistics`` (``contracts/reports/statistics.py``) from the store's
parts: one frozen snapshot of their counters and gauges.

Invariant: collecting a snapshot reads counters only; it changes nothing and does no I/O
beyond the journal's file sizes.
"""

from __future__ import annotations

from tierfs.contracts.reports.statistics import RecoveryReport, StoreStatistics
from tierfs.engine.appender import Appender
from tierfs.engine.backup.metadata_backup import MetadataBackup
from tierfs.engine.flush.storage_writer import StorageWriter
from tierfs.engine.journal.log import Journal
from tierfs.engine.read.block_cache import BlockCache
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail import TailBudget
from tierfs.offload.offloader import Offloader
from tierfs.offload.scheduler import PolicyScheduler


def collect_statistics(
    epoch: int,
    table: SegmentTable,
    journal: Journal,
    appender: Appender,
    writer: StorageWriter,
    offloader: Offloader,
    scheduler: PolicyScheduler,
    tail_budget: TailBudget,
    cache: BlockCache,
    recovery: RecoveryReport | None,
    metadata_backup: MetadataBackup | None,
) -> StoreStatistics:
    return StoreStatistics(
        epoch=epoch,
        segments=table.segment_count,
        directories=len(table.directories),
        appends=appender.appends,
        appended_bytes=appender.appended_bytes,
        journal_syncs=journal.syncs,
        journal_bytes=journal.size_bytes(),
        journal_files=journal.file_count(),
        unflushed_bytes=writer.unflushed_bytes,
        flush_lag_s=writer.flush_lag_s(),
        tail_memory_bytes=tail_budget.used_bytes,
        flushes=writer.flushes,
        flushed_bytes=writer.flushed_bytes,
        flush_failures=writer.failures,
        journal_files_deleted=writer.journal_files_deleted,
        offloaded_bytes=offloader.offloaded_bytes,
        offloaded_chunks=offloader.offloaded_chunks,
        offload_failures=offloader.failures,
        offload_oldest_waiting_s=scheduler.oldest_waiting_s,
        hot_copies_deleted=offloader.hot_copies_deleted,
        retention_deleted_bytes=scheduler.retention_deleted_bytes,
        metadata_backups=0 if metadata_backup is None else metadata_backup.backups_taken,
        metadata_backup_failures=0 if metadata_backup is None else metadata_backup.failures,
        cache=cache.statistics(),
        recovery=recovery,
    )
