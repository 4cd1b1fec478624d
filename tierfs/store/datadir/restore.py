"""``tierfs restore``: rebuild a data dir from tier-2 alone, then own that tier-2.

``restore_store`` runs the two steps: ``restore_metadata`` (engine/backup/restore.py)
installs the newest intact metadata backup, with the changes shipped after it, and the
highest epoch any owner used; ``open_as_new_owner`` opens the store, which replays the
data dir's journal if one is left (every intact frame above what tier-2 holds), begins
an epoch above all of them, takes a first backup under that epoch and checks every
chunk (fsck).

Invariants:
- Restore is an explicit takeover: the old owner is presumed dead. ``open_as_new_owner``
  is the one place the restored data dir becomes the owner of tier-2 (the step to route
  through an ownership claim on tier-2 when there is one).
- The restored store writes only chunks of its new epoch, so it never overwrites an
  object any earlier owner wrote.
"""

from __future__ import annotations

import dataclasses

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.reports.fsck import FsckReport
from tierfs.engine.backup.objects import BackupManifest
from tierfs.engine.backup.restore import RestoredMetadata, restore_metadata
from tierfs.store.facade import open_store


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    manifest: BackupManifest  # the backup restored
    segments: int
    set_aside: tuple[str, ...]  # old files renamed out of the way in the data dir
    epoch: int  # the restored store's owner epoch
    fsck: FsckReport
    changes_applied: int  # change batches applied over the snapshot
    changes_missing: str | None  # what could not be applied, and why (None: everything)
    appends_replayed: int  # from the data dir's journal
    bytes_replayed: int


@dataclasses.dataclass(frozen=True)
class NewOwner:
    epoch: int
    fsck: FsckReport
    appends_replayed: int
    bytes_replayed: int


async def restore_store(config: StoreConfig) -> RestoreReport:
    """Rebuild ``config.data_dir`` from the backups in ``config.tier2_url``."""
    if not config.tier2_url:
        raise InvalidArgumentError("restore needs the tier-2 URL to restore from (--tier2 URL)")
    if is_postgresql_url(config.metadata_url):
        raise InvalidArgumentError(
            "restore rebuilds SQLite metadata from tier-2's backups; metadata on PostgreSQL "
            f"({config.metadata_description}) is not backed up into tier-2: restore it with "
            "PostgreSQL's own backups, and open the data dir with --takeover"
        )
    restored: RestoredMetadata = await trio.to_thread.run_sync(
        restore_metadata, config.data_dir, config.chunk_store_url, config.chunk_store_options,
        config.tier2_identity
    )
    owner = await open_as_new_owner(config)
    return RestoreReport(restored.manifest, restored.segments, restored.set_aside, owner.epoch, owner.fsck,
                         restored.changes_applied, restored.changes_missing, owner.appends_replayed,
                         owner.bytes_replayed)


async def open_as_new_owner(config: StoreConfig) -> NewOwner:
    """Open the restored data dir as the new owner of its tier-2: a takeover (the old
    owner is presumed dead; if it is not, it is fenced), so a new epoch above every
    claim and every epoch in the backup, a first backup under it, and fsck of every
    chunk."""
    async with open_store(dataclasses.replace(config, takeover=True)) as store:
        await store.flush()  # what the journal held is in tier-2 before the first backup
        if store.metadata_backup is not None:  # restore_store only restores SQLite
            await store.metadata_backup.cycle()
        recovery = store.statistics().recovery
        replayed = (recovery.frames_replayed, recovery.bytes_replayed) if recovery is not None else (0, 0)
        return NewOwner(store.epoch, await store.fsck(), *replayed)
