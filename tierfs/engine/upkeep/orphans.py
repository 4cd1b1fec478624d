"""Orphan collection: deletes tier-2 and long-term objects that no metadata references.

Orphans come from work a crash or a race cut short: a flush that wrote a chunk object
but died before its metadata commit (the next owner epoch writes new names, so nothing
ever points at it), an offload upload that finished after its chunk was deleted or
expired (the queued garbage was collected before the object existed), objects of a
metadata copy that was restored from an older backup. Objects the metadata *queued* as
garbage are the ``GarbageCollector``'s; this module finds the ones nobody queued.

A sweep, in order:
1. list every object of the chunk store and of the long-term store (sizes, mtimes);
2. then read the metadata's references, in one call on the catalogue's worker thread
   (``metadata.scans.object_references``): chunk names, offload keys of recorded
   attempts, queued garbage, every segment's ``next_chunk_seq``;
3. keep only candidates: names of exactly a chunk's shape ``s<8 digits>/e<6
   digits>-c<8 digits>`` or a pack's ``packs/e<6 digits>-<32 hex digits>`` (chunk
   store) or an offload attempt's ``<chunk or pack name>-<UUID>.data|.index``
   (long-term store), neither referenced nor queued. Nothing else under either URL
   (``_owner/`` claims, ``_metadata/`` backups, anything a user put there) is ever a
   candidate;
4. keep those that are not in flight, of an owner epoch at most ours and not below
   ``foreign_below_epoch``, and older than ``orphan_grace_s`` by their mtime on the
   store's wall clock (unknown mtime: kept);
5. delete them (``--dry-run``: only report them).

Why a concurrent commit cannot lose an object (the race between list and delete):
- Every listed object existed before the references were read (step 1 ends before step
  2 starts), and the references are one consistent instant: all metadata calls run one
  at a time on the catalogue's worker, so no commit falls inside that read.
- A chunk object becomes referenced only by a flush commit *after* its write. This
  process writes new chunk objects only under its own epoch, with sequence
  ``next_chunk_seq`` of a live segment, which a commit then advances; it never writes a
  name of an older epoch nor a sequence below ``next_chunk_seq`` again. So an own-epoch
  object whose sequence is at or above its segment's ``next_chunk_seq`` (or whose
  segment is gone from the metadata) may be in flight or about to be rewritten by a
  retried flush, and is kept; one below it that the same instant's references do not
  name will never be written nor committed again, and deleting it is safe. Appends
  (local tier-2) only grow a chunk that is already referenced.
- Packs (many segments' small chunks in one object, written by the storage writer's
  batches) are never queued as garbage: the sweep is what deletes them, once no chunk
  record references them. A pack becomes referenced by its batch's commit, after its
  write; until that commit ended (committed or failed) its name is in the writer's
  ``packs_in_flight``, which the sweep copies after the listing and before reading the
  references. A listed pack missing from that copy left the set before it, so its
  commit had ended: committed, the references (read later) name it; failed, it is
  never committed (a batch retries under a new name) and may go. A chunk leaving a
  pack (delete, retention, defrag) queues a hold (``object_keys.pack_hold``) in the
  same transaction, with that operation's deletion lag; a queued hold keeps the pack.
- Defrag's merged chunk takes its sequence number before it is written (below
  ``next_chunk_seq`` at once): its name is in the defragmenter's ``merging`` from
  before its write until its swap committed (or it was queued as garbage), copied with
  ``packs_in_flight``, so whatever the grace period, a merge is never deleted under it.
- An offload key is recorded in the chunk record before its upload starts (PIP-17),
  so it is referenced while its attempt lives; the offloader lists the keys it is
  uploading (``Offloader.uploading``), checked after the listing, so an upload that
  outlived its record is not touched until it has finished. Keys carry a fresh UUID:
  a key once uploaded is never written again.
- The parts that delete referenced or queued objects (garbage collection, the
  offloader's hot copies and replaced attempts) delete before the commit that drops the
  name. An object listed before such a delete, whose name a later commit dropped
  before the references were read, was never an orphan: the sweep watches the
  ``RemovalLog`` from before its listing until it has sorted the candidates and keeps
  every name removed meanwhile (counted as in flight).
- Epochs: an object named with an epoch newer than ours belongs to a newer owner (this
  process is then a zombie that fencing stops) and is never touched. Older epochs
  belong to owners that are gone, and this metadata is theirs continued when this data
  dir (or the shared PostgreSQL database) is the one they committed to: an object of
  theirs it does not reference was never committed, and the grace period covers their
  write still landing. Not so after a takeover from another data dir, a copy's or a
  restore's (``foreign_below_epoch``, set by the open): the other data dir's metadata
  may reference objects of its epochs that this one never saw (acknowledged appends
  it flushed after the copy was made). Those are never deleted by a sweep: they are
  counted and listed (``GcReport.kept_older_owner``, ``tierfs lost-found list``) until
  ``tierfs gc --older-owners`` is asked for. An offload key carries the *chunk's*
  epoch, not its uploader's: the tier-2 and long-term URLs belong to one store.

Invariants: never a referenced, queued, in-flight, newer-epoch, older-lineage, young or
non-candidate-shaped object (older-lineage ones only on explicit request); one sweep at
a time; blocking calls in worker threads under the tier-2 limiter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Container
from typing import Protocol

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import TierFSError
from tierfs.contracts.reports.gc import LONG_TERM, TIER2, GcReport, OrphanObject
from tierfs.engine.object_keys import (
    ChunkShape,
    ObjectReferences,
    chunk_shape,
    offload_key_shape,
)
from tierfs.engine.tier2.chunk_storage import StoredObject
from tierfs.engine.upkeep.removals import RemovalLog

log = logging.getLogger(__name__)


class ObjectStore(Protocol):
    """A store whose objects can be listed with their mtimes and deleted (blocking)."""

    def list_objects(self) -> list[StoredObject]: ...

    def delete(self, name: str) -> None: ...


class ReferenceSource(Protocol):
    """The metadata's object references at one instant (``ChunkCatalogue``)."""

    async def object_references(self) -> ObjectReferences: ...


class OrphanSweeper:
    def __init__(
        self,
        config: StoreConfig,
        epoch: int,
        references: ReferenceSource,
        chunk_storage: ObjectStore,
        long_term: ObjectStore | None,
        uploading: Container[str],
        tier2_limiter: trio.CapacityLimiter,
        clock: Callable[[], float],
        removals: RemovalLog,
        packs_in_flight: Collection[str] = (),
        merging: Collection[str] = (),
        foreign_below_epoch: int = 0,
    ) -> None:
        self._epoch = epoch
        self._foreign_below_epoch = foreign_below_epoch
        self._removals = removals  # objects their owners are deleting
        self._packs_in_flight = packs_in_flight  # the storage writer's, written and not yet committed
        self._merging = merging  # defrag's merged objects, written and not yet committed
        self._references = references
        self.chunk_storage = chunk_storage  # replaced with the store's (tests wrap it)
        self._long_term = long_term
        self._uploading = uploading  # long-term keys being uploaded right now
        self._limiter = tier2_limiter
        self._clock = clock  # wall-clock seconds, compared with object mtimes
        self.grace_s = config.orphan_grace_s
        self._interval_s = config.orphan_gc_interval_s
        self._lock = trio.Lock()
        self.deleted_objects = 0
        self.deleted_bytes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval_s`` (never with 0) until cancelled."""
        task_status.started()
        while self._interval_s > 0:
            await trio.sleep(self._interval_s)
            try:
                await self.sweep(dry_run=False)
            except TierFSError as e:
                log.warning("orphan collection failed, will retry in %.0f s: %s", self._interval_s, e)

    async def sweep(self, *, dry_run: bool, older_owners: bool = False) -> GcReport:
        """Delete (with ``dry_run``: list) the orphans older than the grace period; with
        ``older_owners`` also those of another lineage's epochs (see the docstring)."""
        async with self._lock:
            return await self._sweep(dry_run, self.grace_s, older_owners)

    async def unreferenced(self) -> list[OrphanObject]:
        """Every orphan whatever its age (what fsck reports); deletes nothing."""
        async with self._lock:
            report = await self._sweep(True, 0.0, older_owners=False)
            return report.orphans + report.kept_older_owner

    async def _sweep(self, dry_run: bool, grace_s: float, older_owners: bool) -> GcReport:
        stores: list[tuple[str, ObjectStore]] = [(TIER2, self.chunk_storage)]
        if self._long_term is not None:
            stores.append((LONG_TERM, self._long_term))
        newer_epoch = in_flight = young = 0
        older_owner: list[OrphanObject] = []
        doomed: list[tuple[ObjectStore, OrphanObject]] = []
        with self._removals.watching() as removed:
            listings = [
                (label, store, await trio.to_thread.run_sync(store.list_objects, limiter=self._limiter))
                for label, store in stores
            ]
            # after every listing, before the references
            packing = frozenset(self._packs_in_flight) | frozenset(self._merging)
            references = await self._references.object_references()  # after every listing
            now_s = self._clock()
            for label, store, objects in listings:
                for obj in objects:
                    shape = self._candidate(label, obj.name, references)
                    if shape is None:
                        continue
                    if shape.epoch > self._epoch:
                        newer_epoch += 1
                    elif obj.name in removed or self._in_flight(label, obj.name, shape, references, packing):
                        in_flight += 1
                    elif obj.modified_s is None or now_s - obj.modified_s < grace_s:
                        young += 1
                    else:
                        orphan = OrphanObject(label, obj.name, obj.size_bytes, now_s - obj.modified_s, shape.epoch)
                        if shape.epoch < self._foreign_below_epoch and not older_owners:
                            older_owner.append(orphan)
                        else:
                            doomed.append((store, orphan))
        report = GcReport(dry_run, grace_s, [], young, in_flight, newer_epoch, kept_older_owner=older_owner)
        if older_owner:
            log.warning("kept %d unreferenced objects (%d bytes) of owner epochs below %d: another data dir "
                        "(the one this store took over from) may reference them (tierfs lost-found list; "
                        "tierfs gc --older-owners deletes them)", len(older_owner),
                        sum(o.size_bytes for o in older_owner), self._foreign_below_epoch)
        for store, orphan in doomed:
            if not dry_run:
                # asked for: an older lineage's object goes too (the storage keeps it otherwise)
                delete = getattr(store, "delete_shared", store.delete) if older_owners else store.delete
                try:
                    await trio.to_thread.run_sync(delete, orphan.name, limiter=self._limiter)
                except TierFSError as e:
                    report.failed.append(f"{orphan.store} {orphan.name}: {e}")
                    continue
                self.deleted_objects += 1
                self.deleted_bytes += orphan.size_bytes
            report.orphans.append(orphan)
        if report.orphans and not dry_run:
            log.warning("deleted %d orphan objects (%d bytes) no metadata referenced",
                        len(report.orphans), report.orphan_bytes)
        return report

    @staticmethod
    def _candidate(label: str, name: str, references: ObjectReferences) -> ChunkShape | None:
        """The ids of an unreferenced, unqueued object of a candidate's shape, else None."""
        if label == TIER2:
            if name in references.tier2 or name in references.queued_tier2:
                return None
            return chunk_shape(name)
        if name in references.long_term or name in references.queued_long_term:
            return None
        return offload_key_shape(name)

    def _in_flight(
        self, label: str, name: str, shape: ChunkShape, references: ObjectReferences, packing: frozenset[str]
    ) -> bool:
        if label == LONG_TERM:
            return name in self._uploading
        if shape.epoch < self._epoch:
            return False  # only an owner of that epoch writes it, and it is gone
        if shape.pack or name in packing:
            return name in packing
        next_seq = references.next_chunk_seq.get(shape.segment_id)
        return next_seq is None or shape.seq >= next_seq

