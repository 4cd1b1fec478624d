"""SegmentStore: the engine's public API, and its lifecycle.

``open_store(config)`` takes ownership of the data dir (lock + new epoch), recovers the
journal, starts the group-commit loop and the storage writer, and on exit flushes what
it can, syncs and closes everything.

Invariants:
- Appends to one segment get offsets in call order and never interleave: an append is
  one journal frame, and its offset is assigned synchronously on the event loop.
- PD appends return after the fdatasync covering their frame; VD appends after
  write(2). Ordinary reads and ``stat().length`` stop at the durable length (LAC);
  only ``read(unconfirmed=True)`` goes up to the appended length (LAP).
- Namespace changes (create, mkdir, rmdir, rename, delete) are serialized by one lock
  and committed to metadata before the in-memory maps change; a failed commit leaves
  memory unchanged.
- Every argument is validated before any change.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import trio

from tierfs.contracts import names
from tierfs.contracts.config import DURABILITY_LEVELS, StoreConfig
from tierfs.contracts.errors import (
    AlreadyCommittedError,
    AppendTooLargeError,
    BacklogFullError,
    BadOffsetError,
    ConcurrentModificationError,
    InvalidArgumentError,
    IsADirectoryError_,
    NotADirectoryError_,
    OffloadRunningError,
    OffsetOutOfRangeError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    StoreClosedError,
    Tier2Error,
    TruncatedError,
    single_error,
)
from tierfs.contracts.fsck_report import FsckReport
from tierfs.contracts.info import DirectoryInfo, Info, SegmentInfo
from tierfs.contracts.policy import Policy
from tierfs.engine import records
from tierfs.engine.blockcache import BlockCache, CacheStatistics
from tierfs.engine.chunkstore import ChunkStorage, open_chunk_storage
from tierfs.engine.journal import Journal
from tierfs.engine.metadata import MetadataStore, SegmentRow, now_ns
from tierfs.engine.object_keys import LONG_TERM_GARBAGE_PREFIX
from tierfs.engine.ownership import DataDirLock
from tierfs.engine.readahead import SegmentReader
from tierfs.engine.reader import Reader
from tierfs.engine.recovery import RecoveryReport, recover_journal
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.storage_writer import StorageWriter
from tierfs.engine.tail import TailBudget, TailEntry
from tierfs.offload.offloader import Offloader

log = logging.getLogger(__name__)
T = TypeVar("T")

YIELD_EVERY_S = 0.0002  # a VD appender in a tight loop still lets other tasks run


MAX_WRITER_MARKS = 1024  # per segment; the oldest writer's mark is dropped beyond this


def _set_writer_mark(record: Any, writer: str, writer_seq: int) -> None:
    """Record ``writer_seq`` as ``writer``'s last committed transaction, most recent last."""
    marks = dict(zip(record.txn_writer_ids, record.txn_writer_seqs, strict=True))
    marks.pop(writer, None)
    marks[writer] = writer_seq
    kept = list(marks.items())[-MAX_WRITER_MARKS:]
    del record.txn_writer_ids[:]
    del record.txn_writer_seqs[:]
    record.txn_writer_ids.extend(name for name, _ in kept)
    record.txn_writer_seqs.extend(seq for _, seq in kept)


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
    cache: CacheStatistics
    recovery: RecoveryReport | None


class SegmentStore:
    """Use through ``open_store``; all methods run on the store's trio event loop."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.epoch = 0
        self._lock = DataDirLock(config.data_dir)
        self.metadata: MetadataStore
        self.journal: Journal
        self.chunk_storage: ChunkStorage
        self.tier2_limiter = trio.CapacityLimiter(config.tier2_concurrency)
        self._metadata_limiter = trio.CapacityLimiter(1)
        self._namespace_lock = trio.Lock()
        self.tail_budget = TailBudget(config.tail_memory_bytes, config.tail_keep_max_bytes)
        self.block_cache = BlockCache(config.block_cache_bytes)
        self.reader = Reader(self)
        self.writer = StorageWriter(self)
        # wall-clock seconds used by policies and the deletion lag (tests replace it)
        self.clock: Callable[[], float] = time.time
        self.offloader = Offloader(self)
        self._root_directory: Any = None
        self._segments: dict[str, SegmentState] = {}
        self._segments_by_id: dict[int, SegmentState] = {}
        self._directories: dict[str, Any] = {}
        self._awaiting_durable: deque[tuple[int, SegmentState, int]] = deque()
        # called (in the event loop, must not block) with each segment whose durable
        # length advanced; the FUSE mount tells the kernel its size changed
        self.growth_listeners: builtins.list[Callable[[SegmentState], None]] = []
        self.unflushed_bytes = 0
        self._appends = 0
        self._appended_bytes = 0
        self._last_yield_s = 0.0
        self._closed = False
        self._recovery: RecoveryReport | None = None
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle
    async def _start(self) -> None:
        self._lock.acquire()
        try:
            await trio.to_thread.run_sync(self._open_blocking)
        except BaseException:
            self._lock.release()
            raise

    def _open_blocking(self) -> None:
        config = self.config
        data_dir = config.data_dir
        (data_dir / "journal").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.metadata = MetadataStore(data_dir / "metadata.sqlite")
        store_record = self.metadata.begin_epoch()
        self.epoch = int(store_record.epoch)
        self.chunk_storage = open_chunk_storage(config.chunk_store_url, config.chunk_store_options)
        self._directories = self.metadata.load_directories()
        self._root_directory = self.metadata.load_root_directory()
        for row in self.metadata.load_segments():
            flushed = int(row.record.flushed_length)
            seg = SegmentState(row, appended_length=flushed, durable_length=flushed)
            self._segments[row.name] = seg
            self._segments_by_id[row.segment_id] = seg
        report = recover_journal(
            data_dir / "journal",
            int(store_record.journal_checkpoint_lsn),
            self._segments_by_id,
            self.tail_budget,
            config.max_append_bytes + 64,
        )
        self._recovery = report
        for seg in self._segments.values():
            if seg.appended_length > seg.flushed_length:
                self.unflushed_bytes += seg.appended_length - seg.flushed_length
                self.writer.dirty.add(seg)
        self.journal = Journal(
            data_dir / "journal",
            start_lsn=report.end_lsn,
            next_seq=report.next_seq,
            file_bytes=config.journal_file_bytes,
            vd_sync_interval_s=config.vd_sync_interval_s,
            on_durable=self._on_durable,
        )
        self.tail_budget.evict(self.journal.written_lsn)
        log.info(
            "opened %s epoch %d: %d segments, replayed %d appends (%d bytes), cut %d torn bytes",
            data_dir, self.epoch, len(self._segments), report.frames_replayed,
            report.bytes_replayed, report.torn_bytes_cut,
        )

    async def _shutdown(self) -> None:
        """Clean shutdown: sync the journal, flush to tier-2 (bounded), close."""
        self._closed = True
        await self.journal.sync()
        with trio.move_on_after(max(10.0, self.config.flush_interval_s * 4)) as scope:
            try:
                await self._flush_all()
            except Tier2Error as e:
                log.warning("shutdown: tier-2 flush incomplete (data stays in the journal): %s", e)
        if scope.cancelled_caught:
            log.warning("shutdown: tier-2 flush timed out; unflushed data stays in the journal")

    def _close_files(self) -> None:
        try:
            self.metadata.close()
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ helpers
    async def metadata_call(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._metadata_limiter)

    async def queue_garbage(self, chunk_names: builtins.list[str]) -> None:
        if chunk_names:
            await self.metadata_call(self.metadata.queue_garbage, chunk_names)
            if self._nursery is not None:
                self._nursery.start_soon(self._collect_garbage)

    async def _collect_garbage(self) -> None:
        """Delete tier-2 objects of deleted segments; forget them once gone."""
        pending = await self.metadata_call(self.metadata.garbage)
        done = []
        long_term = self.offloader.long_term
        for name in pending:
            try:
                if name.startswith(LONG_TERM_GARBAGE_PREFIX):
                    if long_term is None:
                        continue  # kept until tierfs runs with --offload-to again
                    key = name[len(LONG_TERM_GARBAGE_PREFIX):]
                    await trio.to_thread.run_sync(long_term.delete, key, limiter=self.tier2_limiter)
                else:
                    await trio.to_thread.run_sync(
                        self.chunk_storage.delete, name, limiter=self.tier2_limiter
                    )
                done.append(name)
            except Tier2Error as e:
                log.warning("garbage collection of chunk %s failed, will retry: %s", name, e)
        if done:
            await self.metadata_call(self.metadata.forget_garbage, done)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _segment(self, name: str) -> SegmentState:
        self._check_open()
        seg = self._segments.get(name)  # keys are canonical: a hit needs no validation
        if seg is not None:
            return seg
        canonical = names.canonical(name)
        seg = self._segments.get(canonical)
        if seg is None:
            if canonical in self._directories:
                raise IsADirectoryError_(canonical)
            raise SegmentNotFoundError(canonical)
        return seg

    def _check_parent(self, name: str) -> str:
        parent = names.parent_of(name)
        if parent and parent not in self._directories:
            if parent in self._segments:
                raise NotADirectoryError_(parent)
            raise SegmentNotFoundError(parent)
        return parent

    async def chunks_of(self, seg: SegmentState) -> builtins.list[Any]:
        """The segment's chunk records (loaded once, then kept write-through)."""
        if seg.chunks is None:
            chunks = await self.metadata_call(self.metadata.load_chunks, seg.segment_id)
            if seg.chunks is None:
                seg.set_chunks(chunks)
        assert seg.chunks is not None
        return seg.chunks

    def _on_durable(self, lsn: int) -> None:
        """Journal callback: advance LAC of every segment whose frames are now synced."""
        awaiting = self._awaiting_durable
        grown: set[SegmentState] = set()
        while awaiting and awaiting[0][0] <= lsn:
            _, seg, end = awaiting.popleft()
            if end > seg.durable_length:
                seg.durable_length = end
                grown.add(seg)
        for seg in grown:
            seg.notify_grew()
            for listener in self.growth_listeners:
                listener(seg)
            if seg.durable_length - seg.flushed_length >= self.config.flush_bytes:
                self.writer.wake()
        self.tail_budget.evict(self.journal.written_lsn)

    # ------------------------------------------------------------------ namespace
    async def create(
        self, name: str, *, durability: str | None = None, make_parents: bool = False
    ) -> SegmentInfo:
        """Create an empty segment. Its parent directory must exist unless
        ``make_parents``; ``durability`` is 'pd' or 'vd' (default: the store's)."""
        self._check_open()
        canonical = names.canonical(name)
        level = durability or self.config.durability
        if level not in DURABILITY_LEVELS:
            raise InvalidArgumentError(f"durability must be one of {DURABILITY_LEVELS}")
        if make_parents:
            parent = names.parent_of(canonical)
            if parent:
                await self.mkdir(parent, parents=True, exist_ok=True)
        async with self._namespace_lock:
            if canonical in self._segments or canonical in self._directories:
                raise SegmentExistsError(canonical)
            parent = self._check_parent(canonical)
            stamp = now_ns()
            record = records.SegmentRecord(
                durability=level, created_ns=stamp, modified_ns=stamp, next_chunk_seq=1
            )
            row = await self.metadata_call(self.metadata.create_segment, canonical, parent, record)
            seg = SegmentState(row, appended_length=0, durable_length=0)
            seg.set_chunks([])
            self._segments[canonical] = seg
            self._segments_by_id[row.segment_id] = seg
        return self._segment_info(seg)

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        self._check_open()
        canonical = names.canonical(name)
        if parents:
            parts = canonical.split("/")
            for depth in range(1, len(parts)):
                await self.mkdir("/".join(parts[:depth]), exist_ok=True)
        async with self._namespace_lock:
            if canonical in self._directories:
                if exist_ok:
                    return
                raise SegmentExistsError(canonical)
            if canonical in self._segments:
                raise SegmentExistsError(canonical)
            parent = self._check_parent(canonical)
            record = await self.metadata_call(self.metadata.mkdir, canonical, parent)
            self._directories[canonical] = record

    async def rmdir(self, name: str) -> None:
        self._check_open()
        canonical = names.canonical(name)
        async with self._namespace_lock:
            if canonical not in self._directories:
                if canonical in self._segments:
                    raise NotADirectoryError_(canonical)
                raise SegmentNotFoundError(canonical)
            await self.metadata_call(self.metadata.rmdir, canonical)
            del self._directories[canonical]

    async def delete(self, name: str) -> None:
        """Delete a segment; its chunks are garbage-collected in the background."""
        seg = self._segment(name)
        async with self._namespace_lock, seg.meta_lock:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
            chunk_names = await self.metadata_call(self.metadata.delete_segment, seg.row)
            seg.deleted = True
            del self._segments[seg.name]
            del self._segments_by_id[seg.segment_id]
            self.unflushed_bytes -= seg.appended_length - seg.flushed_length
            seg.tail.clear(self.tail_budget)
            self.writer.dirty.discard(seg)
            seg.notify_grew()
            seg.notify_flushed()
        if chunk_names and self._nursery is not None:
            self._nursery.start_soon(self._collect_garbage)

    async def rename(self, old: str, new: str) -> None:
        """Rename a segment or a directory (with everything below it); metadata only."""
        self._check_open()
        source = names.canonical(old)
        target = names.canonical(new)
        if source == target:
            raise InvalidArgumentError(f"cannot rename {source!r} onto itself")
        if names.is_within(target, source):
            raise InvalidArgumentError(f"cannot move {source!r} inside itself")
        async with self._namespace_lock:
            is_directory = source in self._directories
            if not is_directory and source not in self._segments:
                raise SegmentNotFoundError(source)
            if target in self._segments or target in self._directories:
                raise SegmentExistsError(target)
            parent = self._check_parent(target)
            await self.metadata_call(self.metadata.rename, source, target, parent, is_directory)
            moves = [(source, target)]
            if is_directory:
                prefix = source + "/"
                moves += [
                    (n, target + n[len(source):])
                    for n in [*self._segments, *self._directories]
                    if n.startswith(prefix)
                ]
            for before, after in moves:
                if before in self._directories:
                    self._directories[after] = self._directories.pop(before)
                else:
                    seg = self._segments.pop(before)
                    seg.row = dataclasses.replace(seg.row, name=after)
                    self._segments[after] = seg

    async def concat(
        self, target: str, sources: str | list[str], *, writer: str = "", writer_seq: int | None = None
    ) -> SegmentInfo:
        """Append the sealed segment(s) ``sources``, in order, to the end of ``target``
        and remove them: metadata only (their chunks join the target's list, no byte is
        copied), one metadata transaction for all of them. Appends to ``target`` that
        arrive meanwhile wait and land after the sources' bytes.

        With ``writer`` and ``writer_seq`` the concat is also a deduplicated transaction
        commit (Pravega's segment attributes): the target remembers the highest
        ``writer_seq`` committed per ``writer``, and a concat whose ``writer_seq`` is not
        above it raises ``AlreadyCommittedError`` and changes nothing."""
        source_names = [sources] if isinstance(sources, str) else list(sources)
        if not source_names:
            raise InvalidArgumentError("concat needs at least one source")
        if writer_seq is not None and (not writer or writer_seq < 0):
            raise InvalidArgumentError("writer_seq needs a writer id and must be >= 0")
        if writer and writer_seq is None:
            raise InvalidArgumentError("a writer id needs a writer_seq")
        dst = self._segment(target)
        srcs = [self._segment(name) for name in source_names]
        if len({id(seg) for seg in [dst, *srcs]}) != len(srcs) + 1:
            raise InvalidArgumentError(f"cannot concat {dst.name!r} onto itself or name a source twice")
        if dst.sealed:
            raise SegmentSealedError(dst.name)
        self._check_writer_seq(dst, writer, writer_seq)  # early: a replay flushes nothing
        for src in srcs:
            if not src.sealed:
                raise InvalidArgumentError(f"concat source {src.name!r} must be sealed first")
            if src.start_offset:
                raise InvalidArgumentError(
                    f"concat source {src.name!r} lost its head to retention; it cannot be concatenated"
                )
            if self.offloader.is_running(src):
                raise OffloadRunningError(src.name)
        if dst.merge_done is not None:
            raise ConcurrentModificationError(f"a concat into {dst.name!r} is running; retry")
        for src in srcs:
            await self.flush(src.name)
        dst.merge_done = trio.Event()
        try:
            await self.flush(dst.name)  # appends wait from now on: this empties its tail
            async with AsyncExitStack() as locks:
                await locks.enter_async_context(self._namespace_lock)
                for seg in sorted([dst, *srcs], key=lambda seg: seg.segment_id):
                    await locks.enter_async_context(seg.meta_lock)
                moves = await self._concat_locked(dst, srcs, writer, writer_seq)
        finally:
            done, dst.merge_done = dst.merge_done, None
            done.set()
        self.offloader.chunks_moved(moves)
        for src in srcs:
            src.notify_grew()
            src.notify_flushed()
        dst.notify_grew()
        for listener in self.growth_listeners:
            listener(dst)
        return self._segment_info(dst)

    @staticmethod
    def _check_writer_seq(dst: SegmentState, writer: str, writer_seq: int | None) -> None:
        if writer and writer_seq is not None:
            marks = dict(zip(dst.record.txn_writer_ids, dst.record.txn_writer_seqs, strict=True))
            if writer in marks and writer_seq <= marks[writer]:
                raise AlreadyCommittedError(dst.name, writer, writer_seq, marks[writer])

    async def _concat_locked(
        self, dst: SegmentState, srcs: list[SegmentState], writer: str, writer_seq: int | None
    ) -> dict[tuple[int, int], tuple[int, int]]:
        """The concat's one transaction; caller holds the namespace lock and every
        segment's ``meta_lock``. Returns the moved chunks' old -> new addresses."""
        for seg in [dst, *srcs]:
            if seg.deleted:
                raise SegmentNotFoundError(seg.name)
        for src in srcs:
            if not src.sealed or src.flushed_length != src.appended_length:
                raise ConcurrentModificationError(f"{src.name!r} changed during the concat")
        if dst.sealed or dst.appended_length != dst.flushed_length:
            raise ConcurrentModificationError(f"{dst.name!r} changed during the concat")
        self._check_writer_seq(dst, writer, writer_seq)
        await self.chunks_of(dst)
        base = dst.flushed_length
        moved = []
        moves: dict[tuple[int, int], tuple[int, int]] = {}
        for src in srcs:
            for chunk in await self.chunks_of(src):
                copy = type(chunk)()
                copy.CopyFrom(chunk)
                copy.segment_id = dst.segment_id
                copy.start_offset = base + chunk.start_offset
                moved.append(copy)
                moves[(src.segment_id, int(chunk.start_offset))] = (dst.segment_id, int(copy.start_offset))
            base += src.flushed_length
        record = type(dst.record)()
        record.CopyFrom(dst.record)
        record.flushed_length = base
        record.chunk_count = record.chunk_count + len(moved)
        record.modified_ns = now_ns()
        if writer and writer_seq is not None:
            _set_writer_mark(record, writer, writer_seq)
        rev = await self.metadata_call(self.metadata.concat, dst.row, record, [s.row for s in srcs], moved)
        dst.row = SegmentRow(dst.segment_id, dst.name, rev, record)
        assert dst.chunks is not None
        dst.set_chunks([*dst.chunks, *moved])
        dst.appended_length = dst.durable_length = base
        for src in srcs:
            src.deleted = True
            del self._segments[src.name]
            del self._segments_by_id[src.segment_id]
        return moves

    # ------------------------------------------------------------------ data
    async def append(
        self, name: str, data: bytes | bytearray | memoryview, *, expected_offset: int | None = None
    ) -> int:
        """Append ``data`` as one atomic record; returns the offset it starts at.

        With ``expected_offset`` the append happens only if the segment's appended
        length equals it (else ``BadOffsetError``, nothing written).
        """
        seg = self._segment(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"append data must be bytes, not {type(data).__name__}")
        payload = bytes(data)
        size = len(payload)
        if size > self.config.max_append_bytes:
            raise AppendTooLargeError(size, self.config.max_append_bytes)
        if expected_offset is not None and (
            not isinstance(expected_offset, int) or expected_offset < 0
        ):
            raise InvalidArgumentError(f"expected_offset must be an int >= 0, not {expected_offset!r}")
        if seg.merge_done is not None:
            await seg.merge_done.wait()  # a concat into this segment is committing
            return await self.append(name, payload, expected_offset=expected_offset)
        if seg.sealed:
            raise SegmentSealedError(seg.name)
        offset = seg.appended_length
        if expected_offset is not None and expected_offset != offset:
            raise BadOffsetError(seg.name, expected_offset, offset)
        if size == 0:
            await trio.lowlevel.checkpoint()
            return offset
        if self.unflushed_bytes + size > self.config.max_backlog_bytes:
            raise BacklogFullError(self.unflushed_bytes + size, self.config.max_backlog_bytes)
        journal = self.journal
        frame_lsn, end_lsn = journal.add_append(seg.segment_id, offset, payload)
        seg.appended_length = offset + size
        now_s = time.monotonic()
        seg.last_append_s = now_s
        entry = TailEntry(offset, size, frame_lsn, 0, end_lsn, now_s, payload)
        seg.tail.add(entry)
        self.tail_budget.hold(entry)
        self.unflushed_bytes += size
        self._appends += 1
        self._appended_bytes += size
        self._awaiting_durable.append((end_lsn, seg, offset + size))
        self.writer.dirty.add(seg)
        if seg.is_pd:
            await journal.wait_durable(end_lsn)
            return offset
        journal.write_queued()
        if self.tail_budget.over:
            self.tail_budget.evict(journal.written_lsn)
        if now_s - self._last_yield_s >= YIELD_EVERY_S:
            self._last_yield_s = now_s
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        return offset

    async def read(
        self, name: str, offset: int = 0, length: int | None = None, *, unconfirmed: bool = False
    ) -> bytes:
        """Bytes from ``offset``, at most ``length`` (default: to the end).

        Stops at the durable length, or at the appended length with ``unconfirmed``.
        A read at exactly the end returns b''; past the end raises.
        """
        seg = self._segment(name)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"offset must be an int >= 0, not {offset!r}")
        if length is not None and (not isinstance(length, int) or length < 0):
            raise InvalidArgumentError(f"length must be an int >= 0, not {length!r}")
        limit = seg.appended_length if unconfirmed else seg.durable_length
        if offset > limit:
            raise OffsetOutOfRangeError(seg.name, offset, limit)
        end = limit if length is None else min(limit, offset + length)
        if end == offset:
            await trio.lowlevel.checkpoint()
            return b""
        if offset < seg.start_offset:
            raise TruncatedError(seg.name, offset, seg.start_offset)
        data = await self.reader.read(seg, offset, end)
        await trio.lowlevel.checkpoint()  # a read served from memory yields too
        return data

    def open_reader(self, name: str) -> SegmentReader:
        """A reader object for one consumer: sequential reads get adaptive read-ahead."""
        seg = self._segment(name)
        window = min(self.config.readahead_max_bytes, self.config.block_cache_bytes // 4)
        return SegmentReader(self, seg.name, window)

    def prefetch(self, name: str, start: int, end: int) -> int:
        """Start background fetches of flushed blocks in [start, end); returns how many."""
        seg = self._segments.get(name)
        if seg is None or self._nursery is None or self._closed:
            return 0
        return self.reader.prefetch(seg, start, end, self._nursery)

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        """Wait until the durable length exceeds ``offset`` or the timeout passes;
        returns the durable length (a tail read: wakes as soon as new data is durable)."""
        seg = self._segment(name)
        with trio.move_on_after(timeout_s):
            while seg.durable_length <= offset and not seg.deleted:
                await seg.grew_event.wait()
        if seg.deleted:
            raise SegmentNotFoundError(seg.name)
        return seg.durable_length

    async def sync(self, name: str | None = None) -> int:
        """Make every byte appended so far durable (also VD); returns the durable length
        of ``name`` (or the journal's durable LSN without a name)."""
        seg = self._segment(name) if name is not None else None
        self._check_open()
        lsn = await self.journal.sync()
        return seg.durable_length if seg is not None else lsn

    async def flush(self, name: str | None = None) -> None:
        """Wait until tier-2 holds every byte durable now (of one segment or all)."""
        segs = [self._segment(name)] if name is not None else None
        await self.journal.sync()
        await self._flush_all(segs)

    async def _flush_all(self, segs: builtins.list[SegmentState] | None = None) -> None:
        targets = [(s, s.durable_length) for s in (segs or list(self._segments.values()))]
        for seg, target in targets:
            while not seg.deleted and seg.flushed_length < target:
                seg.flush_requested = True
                seg.retry_at_s = 0.0
                self.writer.dirty.add(seg)
                self.writer.wake()
                await seg.flushed_event.wait()
                if seg.last_flush_error and seg.flushed_length < target:
                    raise Tier2Error(f"flush of {seg.name!r} failed: {seg.last_flush_error}")

    async def seal(self, name: str) -> SegmentInfo:
        """Make the segment read-only; its length is final. Triggers a flush."""
        return await self._set_sealed(name, True)

    async def unseal(self, name: str) -> SegmentInfo:
        return await self._set_sealed(name, False)

    async def _set_sealed(self, name: str, sealed: bool) -> SegmentInfo:
        seg = self._segment(name)
        async with seg.meta_lock:
            if bool(seg.record.sealed) != sealed:
                seg.sealing = sealed  # refuse appends from now while the commit runs
                try:
                    await self._update_record(seg, sealed=sealed, sealed_ns=now_ns() if sealed else 0)
                finally:
                    seg.sealing = False
        if sealed:
            seg.flush_requested = True
            self.writer.dirty.add(seg)
            self.writer.wake()
        return self._segment_info(seg)

    async def set_durability(self, name: str, durability: str) -> SegmentInfo:
        """Choose PD or VD for a segment that holds no bytes yet."""
        seg = self._segment(name)
        if durability not in DURABILITY_LEVELS:
            raise InvalidArgumentError(f"durability must be one of {DURABILITY_LEVELS}")
        async with seg.meta_lock:
            if seg.appended_length != 0:
                raise InvalidArgumentError(
                    f"durability of {seg.name!r} can only change while it is empty"
                )
            await self._update_record(seg, durability=durability)
        return self._segment_info(seg)

    async def _update_record(self, seg: SegmentState, **fields: Any) -> None:
        """Caller holds ``seg.meta_lock``."""
        record = type(seg.record)()
        record.CopyFrom(seg.record)
        for key, value in fields.items():
            setattr(record, key, value)
        record.modified_ns = now_ns()
        rev = await self.metadata_call(self.metadata.update_segment, seg.row, record)
        seg.row = SegmentRow(seg.segment_id, seg.name, rev, record)

    # ------------------------------------------------------------------ offload, policies
    def segment_by_id(self, segment_id: int) -> SegmentState | None:
        return self._segments_by_id.get(segment_id)

    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        """Start offloading the segment's sealed chunks that end at or before ``up_to``
        (default: all of them) to the long-term store; returns the job's status at once.
        ``OffloadRunningError`` if a job for this segment is running."""
        return await self.offloader.request(self._segment(name), up_to)

    async def offload_status(self, name: str) -> dict[str, Any]:
        """NOT_RUN / RUNNING / SUCCESS / ERROR of the segment's latest offload job, its
        progress, and how many of its sealed bytes are offloaded."""
        seg = self._segment(name)
        await self.chunks_of(seg)
        return self.offloader.status(seg)

    def _directory_record(self, name: str) -> Any:
        return self._root_directory if name == "" else self._directories[name]

    def _ancestors(self, name: str) -> builtins.list[str]:
        """'' (the root) and every directory above ``name``, outermost first."""
        parts = name.split("/") if name else []
        return [""] + ["/".join(parts[:depth]) for depth in range(1, len(parts))]

    def _policy_chain(self, name: str) -> builtins.list[str]:
        """The directories whose policies apply to ``name``, outermost first (itself
        included if it is a directory)."""
        return self._ancestors(name) + ([name] if name in self._directories else [])

    def effective_policy(self, name: str) -> Policy:
        """The policy that applies to ``name``: each key from the nearest directory
        (itself included if it is one) that sets it."""
        policy = Policy()
        for directory in self._policy_chain(name):
            record = self._directory_record(directory)
            if record.policy_set:
                policy = Policy.from_record(record).over(policy)
        return policy

    def segments_with_policy(self) -> builtins.list[tuple[SegmentState, Policy]]:
        """Every segment a policy applies to, with that policy."""
        if not self._root_directory.policy_set and not any(
            r.policy_set for r in self._directories.values()
        ):
            return []
        found = [(seg, self.effective_policy(seg.name)) for seg in list(self._segments.values())]
        return [(seg, policy) for seg, policy in found if not policy.is_empty]

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        """Set (or, with None, unset) policy keys on a directory ('' is the root)."""
        self._check_open()
        directory = names.canonical(name, allow_root=True)
        async with self._namespace_lock:
            if directory and directory not in self._directories:
                if directory in self._segments:
                    raise NotADirectoryError_(directory)
                raise SegmentNotFoundError(directory)
            old = self._directory_record(directory)
            updated = type(old)()
            updated.CopyFrom(old)
            Policy.from_record(old).changed(assignments).store_in(updated)
            self._set_directory_record(directory, updated)
            try:
                # the change must leave every directory at and below this one consistent
                for inner in [directory, *self._directories]:
                    if inner == directory or names.is_within(inner, directory):
                        self.effective_policy(inner).check(inner)
                await self.metadata_call(self.metadata.update_directory, directory, updated)
            except BaseException:
                self._set_directory_record(directory, old)
                raise
        self.offloader.wake()
        return self._policy_report(directory)

    def _set_directory_record(self, name: str, record: Any) -> None:
        if name == "":
            self._root_directory = record
        else:
            self._directories[name] = record

    async def get_policy(self, name: str) -> dict[str, Any]:
        """The keys set on ``name`` itself, and the effective value of each key with the
        directory it comes from."""
        await trio.lowlevel.checkpoint()
        return self._policy_report(name)

    def _policy_report(self, name: str) -> dict[str, Any]:
        self._check_open()
        canonical = names.canonical(name, allow_root=True)
        if canonical and canonical not in self._directories:
            self._segment(canonical)  # not found / is a segment: still report effective
        own = Policy.from_record(self._directory_record(canonical)).items() if (
            canonical == "" or canonical in self._directories) else {}
        effective: dict[str, dict[str, Any]] = {}
        for directory in self._policy_chain(canonical):
            for key, value in Policy.from_record(self._directory_record(directory)).items().items():
                effective[key] = {"value": value, "from": directory}
        return {"path": canonical, "set": own, "effective": effective}

    async def fsck(self) -> FsckReport:
        """Verify every chunk's CRC32C and the metadata invariants (``store.fsck``)."""
        from tierfs.store.fsck import fsck  # it imports this module

        return await fsck(self)

    async def truncate_head(self, seg: SegmentState, chunks: builtins.list[Any]) -> None:
        """Retention: delete whole head ``chunks`` (which must be the first ones, sealed
        and flushed); bytes below the next chunk can no longer be read."""
        async with seg.meta_lock:
            current = await self.chunks_of(seg)
            if seg.deleted or current[: len(chunks)] != chunks:
                return
            last = chunks[-1]
            record = type(seg.record)()
            record.CopyFrom(seg.record)
            record.start_offset = int(last.start_offset + last.length)
            record.chunk_count = max(0, record.chunk_count - len(chunks))
            record.modified_ns = now_ns()
            rev = await self.metadata_call(self.metadata.truncate_head, seg.row, record, chunks)
            seg.row = SegmentRow(seg.segment_id, seg.name, rev, record)
            seg.set_chunks(current[len(chunks):])
        log.info("retention: deleted %d chunks of %r, it now starts at %d",
                 len(chunks), seg.name, record.start_offset)
        if self._nursery is not None:
            self._nursery.start_soon(self._collect_garbage)

    # ------------------------------------------------------------------ info
    def _segment_info(self, seg: SegmentState) -> SegmentInfo:
        record = seg.record
        return SegmentInfo(
            name=seg.name,
            segment_id=seg.segment_id,
            length=seg.durable_length,
            durable_length=seg.durable_length,
            appended_length=seg.appended_length,
            flushed_length=seg.flushed_length,
            sealed=seg.sealed,
            durability=seg.durability,
            chunk_count=int(record.chunk_count),
            created=record.created_ns / 1e9,
            modified=max(record.modified_ns / 1e9, seg.last_append_wall_s()),
            start_offset=seg.start_offset,
        )

    async def stat(self, name: str) -> Info:
        self._check_open()
        canonical = names.canonical(name, allow_root=True)
        await trio.lowlevel.checkpoint()
        if canonical == "":
            return DirectoryInfo(name="", created=0.0)
        if canonical in self._directories:
            return DirectoryInfo(canonical, self._directories[canonical].created_ns / 1e9)
        return self._segment_info(self._segment(canonical))

    async def list(self, name: str = "") -> builtins.list[Info]:
        """Entries directly inside a directory, sorted by name."""
        self._check_open()
        directory = names.canonical(name, allow_root=True)
        if directory and directory not in self._directories:
            if directory in self._segments:
                raise NotADirectoryError_(directory)
            raise SegmentNotFoundError(directory)
        await trio.lowlevel.checkpoint()
        result: builtins.list[Info] = []
        for entry_name, record in self._directories.items():
            if names.parent_of(entry_name) == directory:
                result.append(DirectoryInfo(entry_name, record.created_ns / 1e9))
        for entry_name, seg in self._segments.items():
            if names.parent_of(entry_name) == directory:
                result.append(self._segment_info(seg))
        result.sort(key=lambda info: info.name)
        return result

    async def walk_segments(self) -> builtins.list[SegmentInfo]:
        await trio.lowlevel.checkpoint()
        return [self._segment_info(s) for s in sorted(self._segments.values(), key=lambda s: s.name)]

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        """Chunks of a segment: name, URL, segment offset range, CRCs."""
        seg = self._segment(name)
        chunks = await self.chunks_of(seg)
        return [
            {
                "name": c.name,
                "url": c.location or self.chunk_storage.chunk_url(c.name),
                "start": int(c.start_offset),
                "end": int(c.start_offset + c.length),
                "crc32c": int(c.crc32c),
                "block_crc32c": [int(x) for x in c.block_crc32c],
                "epoch": int(c.epoch),
                "segment_id": int(seg.segment_id),
                "offloaded": bool(c.location),  # "" = in the chunk store
            }
            for c in chunks
        ]

    def _flush_lag_s(self) -> float:
        oldest = [
            t for t in (seg.tail.oldest_append_s() for seg in self.writer.dirty) if t is not None
        ]
        return time.monotonic() - min(oldest) if oldest else 0.0

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            epoch=self.epoch,
            segments=len(self._segments),
            directories=len(self._directories),
            appends=self._appends,
            appended_bytes=self._appended_bytes,
            journal_syncs=self.journal.syncs,
            journal_bytes=self.journal.size_bytes(),
            journal_files=self.journal.file_count(),
            unflushed_bytes=self.unflushed_bytes,
            flush_lag_s=self._flush_lag_s(),
            tail_memory_bytes=self.tail_budget.used_bytes,
            flushes=self.writer.flushes,
            flushed_bytes=self.writer.flushed_bytes,
            flush_failures=self.writer.failures,
            journal_files_deleted=self.writer.journal_files_deleted,
            offloaded_bytes=self.offloader.offloaded_bytes,
            offloaded_chunks=self.offloader.offloaded_chunks,
            offload_failures=self.offloader.failures,
            offload_oldest_waiting_s=self.offloader.oldest_waiting_s,
            hot_copies_deleted=self.offloader.hot_copies_deleted,
            retention_deleted_bytes=self.offloader.retention_deleted_bytes,
            cache=self.block_cache.statistics(),
            recovery=self._recovery,
        )


@asynccontextmanager
async def open_store(config: StoreConfig | None = None) -> AsyncIterator[SegmentStore]:
    """Open the store of ``config.data_dir`` for the duration of the block."""
    store = SegmentStore(config or StoreConfig())
    await store._start()
    try:
        # The caller's block runs inside our nursery; its error comes back unwrapped,
        # as if no nursery were there.
        with single_error():
            async with trio.open_nursery() as nursery:
                await nursery.start(store.journal.run)
                await nursery.start(store.writer.run)
                await nursery.start(store.offloader.run)
                store._nursery = nursery
                nursery.start_soon(store._collect_garbage)
                try:
                    yield store
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            await store._shutdown()
                        finally:
                            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await store.journal.close()
    finally:
        store._closed = True
        store._close_files()
        store.block_cache.clear()  # memory goes back now, not at the next gc cycle
