"""The store's statistics as every front end sees them (the metrics endpoint, the FUSE
statfs, the CLI, the benchmarks): one frozen snapshot of counters and gauges, with the
block cache's and the last recovery's.

Invariant: plain values; importing this loads no engine module, so a front end that only
shows statistics never pulls in the engine.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CacheStatistics:
    hits: int
    misses: int
    evictions: int
    used_bytes: int
    capacity_bytes: int
    gets: int  # ranged reads of tier-2 (a run of several blocks is one)
    fetched_bytes: int
    prefetches: int
    run_gets: int  # of ``gets``: those that fetched a run of more than one block


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    files_replayed: int
    frames_replayed: int
    bytes_replayed: int
    frames_skipped: int
    torn_bytes_cut: int
    files_dropped: int
    end_lsn: int
    next_seq: int
    segments_recreated: int = 0  # creations the metadata had lost (``recreate``)
    unsynced_frames_dropped: int = 0  # whole frames after a torn one, never synced (a power loss)
    damaged_stretches_moved: int = 0  # to lost+found by a repair
    frames_moved: int = 0  # intact frames after a gap, to lost+found by a repair


@dataclasses.dataclass(frozen=True)
class StoreStatistics:
    epoch: int
    segments: int
    directories: int
    appends: int
    appended_bytes: int
    journal_syncs: int
    journal_bytes: int
    journal_files: int
    unflushed_bytes: int
    flush_lag_s: float  # age of the oldest append not yet in tier-2
    tail_memory_bytes: int
    flushes: int
    flushed_bytes: int
    flush_failures: int
    journal_files_deleted: int
    offloaded_bytes: int
    offloaded_chunks: int
    offload_failures: int
    offload_oldest_waiting_s: float  # age of the oldest chunk a policy wants offloaded
    hot_copies_deleted: int
    retention_deleted_bytes: int
    metadata_backups: int  # metadata snapshots uploaded to tier-2 by this owner
    metadata_backup_failures: int  # failed backup cycles (each retried next interval)
    cache: CacheStatistics
    recovery: RecoveryReport | None
