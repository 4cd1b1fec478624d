"""SegmentStore: the engine's public API, its lifecycle and its wiring.

``open_store(config)`` takes the data dir (lock) and tier-2 (an epoch claimed there, then
fenced: engine/ownership/fencing.py), recovers the journal, builds the parts with their narrow
ports (never the façade), starts the group-commit loop, the storage writer, the
offloader and the policy scheduler, and on exit flushes what it can, syncs and closes.

Where an append goes: ``append`` finds the segment and hands it to the ``Appender``
(engine/appender.py), which frames it into the journal, keeps it in the segment's tail
and acknowledges it per durability level; the storage writer later moves the bytes into
tier-2 chunks. Reads go to the ``Reader`` (engine/read/reader.py) through the same lookup.

Invariants:
- Appends to one segment get offsets in call order and never interleave: an append is
  one journal frame, and its offset is assigned synchronously on the event loop.
- PD appends return after the fdatasync covering their frame; VD appends after
  write(2). Ordinary reads and ``stat().length`` stop at the durable length (LAC);
  only ``read(unconfirmed=True)`` goes up to the appended length (LAP).
- Namespace changes are serialized by one lock and committed to metadata before the
  in-memory table changes (``namespace``, ``concat``); a failed commit leaves memory
  unchanged.
- Every argument is validated before any change.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from tierfs.contracts import names
from tierfs.contracts.config import DURABILITY_LEVELS, StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url, redacted_url
from tierfs.contracts.errors import (
    InvalidArgumentError,
    NoSpaceError,
    RewriteRefusedError,
    SegmentNotFoundError,
    Tier2Error,
    single_error,
)
from tierfs.contracts.policy import Policy
from tierfs.contracts.reports.fsck import FsckReport
from tierfs.contracts.reports.gc import GcReport
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.contracts.reports.statistics import RecoveryReport, StoreStatistics
from tierfs.contracts.writers import WriterSeq
from tierfs.engine.appender import Appender
from tierfs.engine.clock import WallClock, monotonic_s, now_ns
from tierfs.engine.journal.log import Journal
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.dir_lock import DataDirLock
from tierfs.engine.ownership.tenure import Lease
from tierfs.engine.read.block_cache import BlockCache
from tierfs.engine.read.readahead import SegmentReader
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.growth import GrowthNotifier
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail import TailBudget
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.offload.longterm import LongTermStore
from tierfs.store import listing
from tierfs.store.attributes import (
    AttributeChange,
    set_directory_attributes,
    set_segment_attributes,
)
from tierfs.store.fsck import fsck
from tierfs.store.holds import SegmentHold
from tierfs.store.opening import OpenedDataDir, open_data_dir
from tierfs.store.statistics import collect_statistics
from tierfs.store.wiring import Shared, build_parts

log = logging.getLogger(__name__)
OPEN_NOTICE_S = 2.0  # an open that takes longer says what it waits for


class SegmentStore:
    """Use through ``open_store``; all methods run on the store's trio event loop."""

    def __init__(self, config: StoreConfig, lease: Lease | None = None) -> None:
        self.config = config
        self._lease = lease
        self.epoch = 0
        self._lock = DataDirLock(config.data_dir)
        self.tier2_limiter = trio.CapacityLimiter(config.tier2_concurrency)
        self.tail_budget = TailBudget(config.tail_memory_bytes, config.tail_keep_max_bytes)
        self.table = SegmentTable()
        # wall-clock seconds used by policies and the deletion lag (tests replace it)
        self._clock = WallClock()
        self.long_term: LongTermStore | None = None
        if config.offload_url:
            self.long_term = LongTermStore(
                config.offload_url, config.long_term_options,
                part_bytes=config.offload_part_bytes,
                upload_concurrency=config.offload_upload_concurrency,
                read_deadline_per_mib_s=config.tier2_read_timeout_s,
            )
        # told the name of each segment whose durable length advanced; the FUSE mount
        # tells the kernel its size changed
        self.growth = GrowthNotifier()
        self.growth_listeners = self.growth.listeners
        self.name_listeners: list[Callable[[str], None]] | None = self.growth.name_listeners
        self._appender = Appender(config, self.tail_budget, self.growth)
        self._recovery: RecoveryReport | None = None
        # the parts are built once the data dir is open (they need the epoch, the journal,
        # metadata): ``_wire``
        self.metadata: MetadataStore
        self.journal: Journal

    # ------------------------------------------------------------------ lifecycle
    async def _start(self, *, interruptible: bool = False) -> None:
        """Open the data dir. ``interruptible`` (a process that ends when the open is
        cancelled: a command, the single-store daemon): Ctrl-C does not wait for tier-2's
        retries; the opening thread is left to end with the process, holding the lock."""
        self._lock.acquire()
        opening_ended = threading.Event()

        def opening(started_s: float) -> OpenedDataDir:
            try:
                return open_data_dir(self.config, self.table, self.tail_budget, self._appender.on_durable, started_s,
                                     None if self._lease is None else self._lease.ensure_valid_to_claim)
            finally:
                opening_ended.set()

        try:
            # replayed appends count as appended now (read here: recovery's thread
            # cannot read the trio clock)
            notice = threading.Timer(OPEN_NOTICE_S, self._say_what_opening_waits_for)
            notice.daemon = True
            notice.start()
            try:
                opened = await trio.to_thread.run_sync(opening, monotonic_s(), abandon_on_cancel=interruptible)
            finally:
                notice.cancel()
            self.metadata, self.epoch, self.journal = opened.metadata, opened.epoch, opened.journal
            self._segment_rows = opened.segment_rows
            self._recovery, self.claim = opened.recovery, opened.claim
            self._wire(opened)
        except BaseException:
            if opening_ended.is_set():  # else the opening goes on: the lock stays until the process ends
                self._lock.release()
            raise

    def _say_what_opening_waits_for(self) -> None:
        """An open that takes more than ``OPEN_NOTICE_S`` says what it waits for: tier-2
        (the owner claim and the journal's checkpoint: it is retried until it answers or
        fails) or the metadata database, and that Ctrl-C stops it (a timer's thread)."""
        config = self.config
        tier2 = redacted_url(config.tier2_url or config.chunk_store_url)
        metadata = redacted_url(config.metadata_url) if is_postgresql_url(config.metadata_url) else "SQLite"
        log.warning("still opening %s after %.0f s: replaying its journal, or waiting for tier-2 (%s) or the "
                    "metadata database (%s), which are retried until they answer or fail (Ctrl-C stops it)",
                    config.data_dir, OPEN_NOTICE_S, tier2, metadata)

    def _wire(self, opened: OpenedDataDir) -> None:
        """Build the parts (``wiring``); each gets the narrow objects it needs, never ``self``."""
        shared = Shared(self.config, self.table, self.tail_budget, self._appender, self.growth, self.long_term,
                        self._clock, self.tier2_limiter, self._lease)
        p = self._parts = build_parts(shared, opened)
        self.fence, self.catalogue, self.garbage, self.writer = p.fence, p.catalogue, p.garbage, p.writer
        self.reader, self.offloader, self.scheduler = p.reader, p.offloader, p.scheduler
        self.long_term_reads, self.orphans, self.defragmenter = p.long_term_reads, p.orphans, p.defragmenter
        self.metadata_backup = p.metadata_backup

    @property
    def clock(self) -> Callable[[], float]:
        """Wall-clock seconds for policies and the deletion lag; assignable (tests)."""
        return self._clock.source

    @clock.setter
    def clock(self, source: Callable[[], float]) -> None:
        self._clock.source = source

    async def _shutdown(self) -> None:
        """Clean shutdown: sync the journal, flush to tier-2 (bounded), close."""
        self.table.closed = True
        try:
            await self.journal.sync()
        except NoSpaceError as e:  # a stalled journal: what waits for space was never acknowledged
            log.error("shutdown: %s; appends still waiting for it are dropped, none was acknowledged", e)
        with trio.move_on_after(max(10.0, self.config.flush_interval_s * 4)) as scope:
            try:
                await self.writer.flush_segments(self.table.in_memory())
            except Tier2Error as e:
                log.warning("shutdown: tier-2 flush incomplete (data stays in the journal): %s", e)
        if scope.cancelled_caught:
            log.warning("shutdown: tier-2 flush timed out; unflushed data stays in the journal")
        await self.writer.checkpoint_flushed()

    def _close_files(self) -> None:
        try:
            self._segment_rows.close()
            self.metadata.close()
            if self.metadata_backup is not None:
                self.metadata_backup.seal()  # its connection is the last one
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ swappable parts
    # Tests wrap the chunk storage (to count or fail requests) and replace the block
    # cache on an open store; every part that holds them sees the new one.
    @property
    def chunk_storage(self) -> ChunkStorage:
        return self._parts.blocks.chunk_storage

    @chunk_storage.setter
    def chunk_storage(self, storage: ChunkStorage) -> None:
        for part in self._parts.chunk_storage_holders():
            part.chunk_storage = storage

    @property
    def block_cache(self) -> BlockCache:
        return self._parts.blocks.cache

    @block_cache.setter
    def block_cache(self, cache: BlockCache) -> None:
        self._parts.blocks.cache = cache

    def _segment(self, name: str) -> SegmentState:
        return self.table.segment(name)

    async def chunks_of(self, seg: SegmentState) -> builtins.list[Chunk]:
        return await self.catalogue.chunks_of(seg)

    # ------------------------------------------------------------------ namespace
    async def create(
        self, name: str, *, durability: str | None = None, make_parents: bool = False
    ) -> SegmentInfo:
        """Create an empty segment. Its parent directory must exist unless
        ``make_parents``; ``durability`` is 'pd', 'vd' or 'tier2' (default: the store's)."""
        return await self._parts.namespace.create(name, durability=durability, make_parents=make_parents)

    async def create_file(self, name: str) -> SegmentInfo:
        """The mount's create (``MountedStore.create_file``): durable with the journal's
        next sync, which a PD append to it waits for anyway, not on its own."""
        return await self._parts.namespace.create(name, synced=False)

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        await self._parts.namespace.mkdir(name, parents=parents, exist_ok=exist_ok)

    async def rmdir(self, name: str) -> None:
        await self._parts.namespace.rmdir(name)

    async def delete(self, name: str) -> None:
        """Delete a segment; its chunks are garbage-collected in the background."""
        await self._parts.namespace.delete(name)

    async def rename(self, old: str, new: str) -> None:
        """Rename a segment or a directory (with everything below it); metadata only."""
        await self._parts.namespace.rename(old, new)

    async def concat(
        self, target: str, sources: str | list[str], *, writer: str = "", writer_seq: int | None = None
    ) -> SegmentInfo:
        """Append the sealed segment(s) ``sources``, in order, to the end of ``target``
        and remove them: metadata only, one metadata transaction (see ``concat``).
        With ``writer``/``writer_seq`` a replayed commit raises ``AlreadyCommittedError``."""
        return await self._parts.concat.concat(target, sources, writer=writer, writer_seq=writer_seq)

    # ------------------------------------------------------------------ data
    async def append(
        self, name: str, data: bytes | bytearray | memoryview, *, expected_offset: int | None = None,
        writer: WriterSeq | None = None,
    ) -> int:
        """Append ``data`` as one atomic record; returns the offset it starts at.

        With ``expected_offset`` the append happens only if the segment's appended
        length equals it (else ``BadOffsetError``, nothing written). With ``writer`` an
        append the segment holds already is answered with its offset, not made again.
        """
        return await self._appender.append(self.table.segment(name), data, expected_offset, writer)

    async def read(
        self, name: str, offset: int = 0, length: int | None = None, *, unconfirmed: bool = False
    ) -> bytes:
        """Bytes from ``offset``, at most ``length`` (default: to the end).

        Stops at the durable length, or at the appended length with ``unconfirmed``.
        A read at exactly the end returns b''; past the end raises.
        """
        seg = self.table.segment(name)
        return await self.reader.read_segment(seg, offset, length, unconfirmed=unconfirmed)

    def open_reader(self, name: str) -> SegmentReader:
        """A reader object for one consumer: sequential reads get adaptive read-ahead."""
        return self.reader_of(self.table.segment(name).name)

    def reader_of(self, name: str, lookup: Callable[[str], SegmentState] | None = None) -> SegmentReader:
        """``open_reader``: finding the segment by name at every read, or with ``lookup``."""
        window = min(self.config.readahead_max_bytes, self.config.block_cache_bytes // 4)
        return SegmentReader(lookup or self.table.segment, self.reader, name, window)

    async def append_to(self, seg: SegmentState, data: bytes, expected_offset: int | None) -> int:
        """``append`` to a segment already found (a ``SegmentHold``'s)."""
        return await self._appender.append(seg, data, expected_offset, None)

    async def hold(self, name: str) -> SegmentHold:
        """Hold the segment called ``name`` for an open descriptor (``store.holds``).
        Taken under the segment's ``meta_lock``: a deletion or replacement committing
        now either saw the hold (and detaches) or finished first (then: not found)."""
        seg = self.table.segment(name)
        async with seg.meta_lock:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            return SegmentHold(self, seg)

    async def rewrite(self, name: str) -> SegmentInfo:
        """Replace the segment ``name`` by a new empty one (same durability, mode and
        owner) in one step, where its directory's policy has ``rewrite_replaces=1``
        (``RewriteRefusedError`` otherwise); a sealed one never (``SegmentSealedError``).
        An open descriptor keeps reading the old one."""
        seg = self.table.segment(name)
        if not self.effective_policy(names.parent_of(seg.name)).rewrite_replaces:
            raise RewriteRefusedError(seg.name)
        return await self._parts.namespace.replace_with_empty(seg.name)

    async def delete_detached(self, seg: SegmentState) -> None:
        await self._parts.namespace.delete_detached(seg)

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        """Wait until the durable length exceeds ``offset`` or the timeout passes;
        returns the durable length (a tail read: wakes as soon as new data is durable)."""
        seg = self.table.segment(name)
        with trio.move_on_after(timeout_s):
            while seg.durable_length <= offset and not seg.deleted:
                await seg.grew_event.wait()
        if seg.deleted:
            self.table.segment(seg.name)  # raises SegmentNotFoundError
        return seg.durable_length

    async def sync(self, name: str | None = None) -> int:
        """Make every byte appended so far durable (also VD); returns the durable length
        of ``name`` (or the journal's durable LSN without a name)."""
        seg = self.table.segment(name) if name is not None else None
        self.table.check_open()
        lsn = await self.journal.sync()
        return seg.durable_length if seg is not None else lsn

    async def flush(self, name: str | None = None) -> None:
        """Wait until tier-2 holds every byte durable now (of one segment or all)."""
        # a segment not in memory has no unflushed bytes
        segs = [self.table.segment(name)] if name is not None else self.table.in_memory()
        await self.writer.sync_and_flush(segs)
        if self.metadata_backup is not None:  # a restore brings back what a flush returned
            await self.metadata_backup.ship_changes()

    async def seal(self, name: str) -> SegmentInfo:
        """Make the segment read-only; its length is final. Triggers a flush."""
        return await self._set_sealed(name, True)

    async def unseal(self, name: str) -> SegmentInfo:
        return await self._set_sealed(name, False)

    async def _set_sealed(self, name: str, sealed: bool) -> SegmentInfo:
        seg = self.table.segment(name)
        async with seg.meta_lock:
            if seg.record.sealed != sealed:
                seg.sealing = sealed  # refuse appends from now while the commit runs
                try:
                    await self.catalogue.update_record(
                        seg, sealed=sealed, sealed_ns=now_ns() if sealed else 0
                    )
                finally:
                    seg.sealing = False
        if sealed:
            self.writer.request_flush(seg)
        self.growth.notify(seg)  # the mode the kernel caches lost or got its write bits
        return listing.segment_info(seg)

    async def set_durability(self, name: str, durability: str) -> SegmentInfo:
        """Choose PD, VD or tier2 for a segment that holds no bytes yet."""
        seg = self.table.segment(name)
        if durability not in DURABILITY_LEVELS:
            raise InvalidArgumentError(f"durability must be one of {DURABILITY_LEVELS}")
        async with seg.meta_lock:
            if seg.appended_length != 0:
                raise InvalidArgumentError(
                    f"durability of {seg.name!r} can only change while it is empty"
                )
            await self.catalogue.update_record(seg, durability=durability)
        self.growth.notify(seg)
        return listing.segment_info(seg)

    async def _delete_detached_leftovers(self) -> None:
        """Segments detached while held (``store.holds``): nothing holds them once the
        store opens again (after a crash of the daemon with descriptors open)."""
        for segment_id in await trio.to_thread.run_sync(self._segment_rows.detached):
            seg = self.table.segment_by_id(segment_id)
            if seg is not None and not seg.deleted:
                log.info("deleting segment %d: deleted while open before the last stop", segment_id)
                await self._parts.namespace.delete_detached(seg)

    def id_space(self, name: str) -> int:
        """Segment ids are unique in the store (``MountedStore.id_space``)."""
        return 0

    async def set_attributes(
        self,
        name: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> Info:
        """Set permission bits, owner and times of a segment or directory ('' is the
        root); None leaves a value as it is. Metadata only (``store.attributes``): a
        mode without write bits seals a segment, the owner's write bit unseals it."""
        self.table.check_open()
        change = AttributeChange(mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns)
        canonical = names.canonical(name, allow_root=True)
        if self.table.is_directory(canonical):
            await set_directory_attributes(self.catalogue, self.table, canonical, change)
        else:
            seg = self.table.segment(canonical)
            was_sealed = seg.record.sealed
            await set_segment_attributes(self.catalogue, seg, change)
            if seg.record.sealed and not was_sealed:
                self.writer.request_flush(seg)
        self.growth.changed(canonical)
        return await listing.stat(self.table, canonical)

    # ------------------------------------------------------------------ offload, policies
    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        """Start offloading the segment's sealed chunks that end at or before ``up_to``
        (default: all of them) to the long-term store; returns the job's status at once.
        ``OffloadRunningError`` if a job for this segment is running."""
        return await self.offloader.request(self.table.segment(name), up_to)

    async def offload_status(self, name: str) -> dict[str, Any]:
        """NOT_RUN / RUNNING / SUCCESS / ERROR of the segment's latest offload job, its
        progress, and how many of its sealed bytes are offloaded."""
        seg = self.table.segment(name)
        await self.catalogue.chunks_of(seg)
        return self.offloader.status(seg)

    def effective_policy(self, name: str) -> Policy:
        return self._parts.policies.effective_policy(name)

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        """Set (or, with None, unset) policy keys on a directory ('' is the root)."""
        return await self._parts.policies.set_policy(name, assignments)

    async def get_policy(self, name: str) -> dict[str, Any]:
        """The keys set on ``name`` itself, and the effective value of each key with the
        directory it comes from."""
        await trio.lowlevel.checkpoint()
        return self._parts.policies.get_policy(name)

    async def defrag(self, name: str) -> dict[str, Any]:
        """Merge the segment's runs of small adjacent chunks (``engine/upkeep/defrag.py``)."""
        return (await self.defragmenter.defrag(self.table.segment(name))).to_json()

    async def fsck(self) -> FsckReport:
        """Verify every chunk's CRC32C and the metadata invariants (``store.fsck``)."""
        return await fsck(self)

    async def gc(self, *, dry_run: bool = False, older_owners: bool = False) -> GcReport:
        """Delete (``dry_run``: list) unreferenced objects past the grace (engine/upkeep/orphans.py)."""
        return await self.orphans.sweep(dry_run=dry_run, older_owners=older_owners)

    # ------------------------------------------------------------------ info
    async def stat(self, name: str) -> Info:
        return await listing.stat(self.table, name)

    async def list(self, name: str = "") -> builtins.list[Info]:
        """Entries directly inside a directory, sorted by name."""
        return await listing.list_directory(self.table, name)

    async def walk_segments(self) -> builtins.list[SegmentInfo]:
        return await listing.walk_segments(self.table)

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        """Chunks of a segment: name, URL, segment offset range, CRCs."""
        seg = self.table.segment(name)
        chunks = await self.catalogue.chunks_of(seg)
        return listing.chunk_layout(seg, chunks, self.chunk_storage.chunk_url)

    def container_statistics(self) -> dict[str, StoreStatistics]:
        return {}  # one store: its figures are statistics()'s

    def statistics(self) -> StoreStatistics:
        return collect_statistics(
            self.epoch, self.table, self.journal, self._appender, self.writer, self.offloader,
            self.scheduler, self.tail_budget, self.block_cache, self._recovery, self.metadata_backup,
        )


@asynccontextmanager
async def open_store(config: StoreConfig | None = None, *, lease: Lease | None = None,
                     interruptible: bool = False) -> AsyncIterator[SegmentStore]:
    """Open the store of ``config.data_dir`` for the duration of the block; ``lease``: in
    cluster mode, the container's lease, without which nothing is acknowledged;
    ``interruptible``: the process ends if the open is cancelled (``_start``)."""
    store = SegmentStore(config or StoreConfig(), lease)
    await store._start(interruptible=interruptible)
    try:
        # The caller's block runs inside our nursery; its error comes back unwrapped,
        # as if no nursery were there.
        with single_error():
            async with trio.open_nursery() as nursery:
                await nursery.start(store.journal.run)
                for task in store._parts.background_tasks():
                    await nursery.start(task)
                store.reader.bind(nursery)
                store.garbage.bind(nursery)
                store.garbage.collect_soon()
                await store._delete_detached_leftovers()
                try:
                    yield store
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            await store._shutdown()
                        finally:
                            store.reader.bind(None)
                            store.garbage.bind(None)
                            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await store.journal.close()
    finally:
        store.table.closed = True
        store._close_files()
        store.block_cache.clear()  # memory goes back now, not at the next gc cycle
