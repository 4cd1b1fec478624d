"""The offloader: moves sealed chunks to the long-term store (Pulsar PIP-17).

The attempt protocol for one chunk; every metadata step is one conditional transaction
under the segment's metadata lock:

1. if an earlier attempt recorded a UUID and did not complete, delete its two objects;
2. record a fresh attempt UUID in the chunk record;
3. read the chunk from the chunk store, verify every block's CRC32C, upload the data
   object (a parallel multipart upload on S3);
4. upload the index object (``offload_format``);
5. mark the offload complete (location = the data object's URL, completion time), only
   if the record still carries this attempt's UUID and the same length;
6. once the deletion lag has passed: delete the chunk-store copy, then record that.

Invariants:
- Reads follow the chunk record: the chunk-store copy until step 5 commits, the
  long-term copy from then on. The chunk-store copy is deleted only after step 5 is
  durable, so a kill -9 at any step leaves a complete copy the metadata points at:
  never a gap, never a half object served (an object is read only once complete).
- Long-term blocks are checked against the block CRC32Cs of the chunk's index object
  (fetched once per chunk and cached, itself checked against the chunk record) before
  they enter the shared block cache.
- At most one offload job runs per segment; a second manual request gets
  ``OffloadRunningError``. At most ``offload_concurrency`` chunks are in flight, so
  memory is bounded by that many chunks (each <= ``max_chunk_bytes``).
- Policies (``policy.py``) and the deletion lag are evaluated every
  ``policy_interval_s`` against ``store.clock`` (tests move that clock).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import cachetools
import trio

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.contracts.errors import (
    ConcurrentModificationError,
    DataCorruptionError,
    InvalidArgumentError,
    OffloadRunningError,
    TierFSError,
    single_error,
)
from tierfs.engine.blockcache import BlockCache
from tierfs.engine.faults import crash_point
from tierfs.engine.metadata import SegmentRow
from tierfs.engine.object_keys import OffloadKeys, new_attempt_uuid
from tierfs.engine.segment_state import SegmentState
from tierfs.offload.longterm import LongTermStore
from tierfs.offload.offload_format import decode_index, encode_index, object_metadata
from tierfs.offload.planning import ChunkFacts, chunks_to_offload, head_chunks_to_expire

if TYPE_CHECKING:
    from tierfs.store.facade import SegmentStore

log = logging.getLogger(__name__)

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"
INDEX_CACHE_BYTES = 8 << 20  # index objects are ~300 B + 4 B per MiB of chunk
INDEX_CACHE_ENTRIES = 4096


@dataclasses.dataclass
class OffloadJob:
    """Progress of the latest offload job of one segment (kept in memory)."""

    state: str = NOT_RUN
    trigger: str = ""  # "manual" or "policy"
    bytes_done: int = 0
    bytes_total: int = 0
    chunks_done: int = 0
    chunks_total: int = 0
    error: str = ""
    started: float = 0.0
    finished: float = 0.0


class Offloader:
    def __init__(self, store: SegmentStore) -> None:
        self._store = store
        config = store.config
        self._config = config
        self.long_term: LongTermStore | None = None
        if config.offload_url:
            self.long_term = LongTermStore(
                config.offload_url, config.long_term_options,
                part_bytes=config.offload_part_bytes,
                upload_concurrency=config.offload_upload_concurrency,
            )
        self._jobs: dict[int, OffloadJob] = {}  # by segment id
        self._running: set[int] = set()
        self._chunk_limiter = trio.CapacityLimiter(config.offload_concurrency)
        self._index_cache = BlockCache(INDEX_CACHE_BYTES)  # raw index objects, single flight
        # decoded and checked indexes: a block read does not parse its index again
        self._indexes: cachetools.LRUCache[str, Any] = cachetools.LRUCache(maxsize=INDEX_CACHE_ENTRIES)
        # (segment id, chunk start) -> completion time (s) of offloads whose
        # chunk-store copy still exists
        self._hot_pending: dict[tuple[int, int], float] = {}
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.offloaded_bytes = 0
        self.offloaded_chunks = 0
        self.failures = 0
        self.hot_copies_deleted = 0
        self.retention_deleted_chunks = 0
        self.retention_deleted_bytes = 0
        self.oldest_waiting_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        store = self._store
        pending = await store.metadata_call(_hot_copies_pending, store.metadata)
        self._hot_pending.update(pending)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                try:
                    await self.scan()
                except TierFSError as e:
                    log.warning("offload/retention scan failed, will retry: %s", e)
                with trio.move_on_after(self._config.policy_interval_s):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()

    def wake(self) -> None:
        """Evaluate policies and the deletion lag now (after a policy change, or in tests)."""
        self._wakeup.set()

    def _require_long_term(self) -> LongTermStore:
        if self.long_term is None:
            raise InvalidArgumentError(
                "no long-term store is configured: start tierfs with --offload-to URL "
                "(or offload_url in the config)"
            )
        return self.long_term

    # ------------------------------------------------------------------ jobs
    def status(self, seg: SegmentState) -> dict[str, Any]:
        job = self._jobs.get(seg.segment_id, OffloadJob())
        chunks = seg.chunks or []
        facts = self.chunk_facts(seg, chunks)
        return {
            "name": seg.name,
            **dataclasses.asdict(job),
            "offloaded_bytes": sum(f.length for f in facts if f.offloaded),
            "sealed_bytes": sum(f.length for f in facts if f.sealed_at_s is not None),
            "long_term_url": self.long_term.url if self.long_term else "",
        }

    async def request(self, seg: SegmentState, up_to: int | None) -> dict[str, Any]:
        """Start offloading every sealed chunk ending at or before ``up_to`` (default:
        all); returns the job's status right away."""
        self._require_long_term()
        if up_to is not None and (not isinstance(up_to, int) or up_to < 0):
            raise InvalidArgumentError(f"up_to must be an int >= 0, not {up_to!r}")
        if seg.segment_id in self._running:
            raise OffloadRunningError(seg.name)
        store = self._store
        if seg.sealed and seg.flushed_length < seg.durable_length:
            await store.flush(seg.name)  # its last chunk is sealed once it holds everything
        chunks = await store.chunks_of(seg)
        if seg.segment_id in self._running:  # started while we flushed
            raise OffloadRunningError(seg.name)
        starts = [
            fact.start for fact in self.chunk_facts(seg, chunks)
            if fact.sealed_at_s is not None and not fact.offloaded
            and (up_to is None or fact.start + fact.length <= up_to)
        ]
        self._start_job(seg, starts, "manual")
        return self.status(seg)

    def _start_job(self, seg: SegmentState, starts: list[int], trigger: str) -> None:
        assert self._nursery is not None and seg.chunks is not None
        lengths = {int(c.start_offset): int(c.length) for c in seg.chunks}
        job = OffloadJob(
            state=RUNNING, trigger=trigger, bytes_total=sum(lengths[s] for s in starts),
            chunks_total=len(starts), started=time.time(),
        )
        self._jobs[seg.segment_id] = job
        self._running.add(seg.segment_id)
        self._nursery.start_soon(self._job, seg, starts, job)

    async def _job(self, seg: SegmentState, starts: list[int], job: OffloadJob) -> None:
        try:
            with single_error():
                async with trio.open_nursery() as nursery:
                    for start in starts:
                        nursery.start_soon(self._offload_under_limit, seg, start, job)
            # copies an earlier run completed but did not get to delete
            await self._delete_due_hot_copies(self._store.clock(), seg.segment_id)
            job.state = SUCCESS
        except Exception as e:
            self.failures += 1
            job.state = ERROR
            job.error = str(e) if isinstance(e, TierFSError) else f"{type(e).__name__}: {e}"
            log.warning("offload of %r failed: %s", seg.name, job.error,
                        exc_info=not isinstance(e, TierFSError))
        finally:
            job.finished = time.time()
            self._running.discard(seg.segment_id)

    async def _offload_under_limit(self, seg: SegmentState, start: int, job: OffloadJob) -> None:
        async with self._chunk_limiter:
            length = await self.offload_chunk(seg, start)
        job.bytes_done += length
        job.chunks_done += 1

    # ------------------------------------------------------------------ the attempt protocol
    async def offload_chunk(self, seg: SegmentState, start: int) -> int:
        """Offload the chunk starting at ``start``; returns its length (0 if it is gone)."""
        long_term = self._require_long_term()
        store = self._store
        await store.chunks_of(seg)
        chunk = seg.chunk_at(start)
        if seg.deleted or chunk is None:
            return 0  # deleted, or expired by retention, meanwhile
        if chunk.offload_complete:
            return int(chunk.length)
        earlier = str(chunk.offload_attempt_uuid)
        if earlier:
            await self._delete_attempt_objects(chunk.name, earlier)
        attempt = new_attempt_uuid()
        async with seg.meta_lock:
            current = seg.chunk_at(start)
            if seg.deleted or current is None:
                return 0
            if current.offload_complete or current.offload_attempt_uuid != earlier:
                raise ConcurrentModificationError(
                    f"chunk {chunk.name} of {seg.name!r} changed while its offload started"
                )
            recorded = _copy(current)
            recorded.offload_attempt_uuid = attempt
            await self._commit_chunk(seg, recorded)
        crash_point("offload.attempt_recorded")

        keys = OffloadKeys.for_attempt(recorded.name, attempt)
        data = await trio.to_thread.run_sync(
            self._read_verified, recorded, limiter=store.tier2_limiter
        )
        await trio.to_thread.run_sync(long_term.put, keys.data, data, object_metadata())
        del data
        crash_point("offload.data_uploaded")
        index = encode_index(seg.name, recorded, attempt)
        await trio.to_thread.run_sync(long_term.put, keys.index, index, object_metadata())
        crash_point("offload.index_uploaded")

        async with seg.meta_lock:
            current = seg.chunk_at(start)
            lost = (
                seg.deleted or current is None or current.offload_attempt_uuid != attempt
                or current.length != recorded.length or current.name != recorded.name
            )
            if not lost:
                done = _copy(current)
                done.offload_complete = True
                done.location = long_term.url_of(keys.data)
                done.offload_completed_ns = int(store.clock() * 1e9)
                await self._commit_chunk(seg, done)
        if lost:
            if not seg.deleted and current is not None:
                await self._delete_attempt_objects(recorded.name, attempt)
            if seg.deleted or current is None:
                return 0
            raise ConcurrentModificationError(
                f"chunk {recorded.name} of {seg.name!r} changed during its offload; "
                f"attempt {attempt} abandoned"
            )
        self.offloaded_bytes += int(done.length)
        self.offloaded_chunks += 1
        crash_point("offload.completed")
        self._hot_pending[(seg.segment_id, start)] = done.offload_completed_ns / 1e9
        if self._config.offload_deletion_lag_s == 0:
            await self._delete_hot_copy(seg, start)
        return int(done.length)

    def _read_verified(self, chunk: Any) -> bytes:
        """The chunk's committed bytes from the chunk store, every block CRC-checked
        (a damaged chunk is never copied to the long-term store)."""
        length = int(chunk.length)
        data = self._store.chunk_storage.read(chunk.name, 0, length)
        if len(data) != length:
            raise DataCorruptionError(
                f"chunk {chunk.name}: the chunk store returned {len(data)} of {length} bytes"
            )
        view = memoryview(data)
        for block, expected in enumerate(chunk.block_crc32c):
            if crc32c(view[block * BLOCK_BYTES : (block + 1) * BLOCK_BYTES]) != expected:
                raise DataCorruptionError(
                    f"chunk {chunk.name} block {block} fails its CRC32C; not offloading it"
                )
        return data

    async def _delete_attempt_objects(self, chunk_name: str, attempt: str) -> None:
        long_term = self._require_long_term()
        keys = OffloadKeys.for_attempt(chunk_name, attempt)
        for key in (keys.data, keys.index):
            await trio.to_thread.run_sync(long_term.delete, key)

    async def _commit_chunk(self, seg: SegmentState, chunk: Any) -> None:
        """Caller holds ``seg.meta_lock``."""
        store = self._store
        rev = await store.metadata_call(store.metadata.commit_chunk_update, seg.row, chunk)
        seg.row = SegmentRow(seg.segment_id, seg.name, rev, seg.record)
        seg.replace_chunk(chunk)

    async def _delete_hot_copy(self, seg: SegmentState, start: int) -> None:
        store = self._store
        await store.chunks_of(seg)
        chunk = seg.chunk_at(start)
        if seg.deleted or chunk is None or not chunk.offload_complete or chunk.offload_hot_deleted:
            self._hot_pending.pop((seg.segment_id, start), None)
            return
        await trio.to_thread.run_sync(
            store.chunk_storage.delete, chunk.name, limiter=store.tier2_limiter
        )
        crash_point("offload.hot_deleted")
        async with seg.meta_lock:
            current = seg.chunk_at(start)
            if not seg.deleted and current is not None and current.name == chunk.name:
                updated = _copy(current)
                updated.offload_hot_deleted = True
                await self._commit_chunk(seg, updated)
        self._hot_pending.pop((seg.segment_id, start), None)
        self.hot_copies_deleted += 1

    def chunks_moved(self, moves: dict[tuple[int, int], tuple[int, int]]) -> None:
        """A concat re-addressed chunks: (segment id, start) before -> after."""
        for before, after in moves.items():
            if before in self._hot_pending:
                self._hot_pending[after] = self._hot_pending.pop(before)

    def is_running(self, seg: SegmentState) -> bool:
        return seg.segment_id in self._running

    async def _delete_due_hot_copies(self, now_s: float, segment_id: int | None = None) -> None:
        """Delete the chunk-store copies whose deletion lag has passed (of one segment,
        or of all)."""
        lag_s = self._config.offload_deletion_lag_s
        for (owner, start), completed_s in list(self._hot_pending.items()):
            if (segment_id is None or owner == segment_id) and now_s - completed_s >= lag_s:
                seg = self._store.segment_by_id(owner)
                if seg is None:
                    self._hot_pending.pop((owner, start), None)
                else:
                    await self._delete_hot_copy(seg, start)

    # ------------------------------------------------------------------ reads
    async def read_block(self, chunk: Any, block: int) -> bytes:
        """One block of an offloaded chunk: a ranged GET, checked against the block
        CRC32C of the chunk's index object."""
        long_term = self._require_long_term()
        index = await self.index_of(chunk)
        key = long_term.key_of(str(chunk.location))
        block_start = block * BLOCK_BYTES
        block_end = min(block_start + BLOCK_BYTES, int(chunk.length))
        expected = index.block_crc32c[block]

        def fetch_and_verify() -> bytes:
            data = long_term.read(key, block_start, block_end)
            if len(data) != block_end - block_start:
                raise DataCorruptionError(
                    f"offloaded chunk {chunk.location} block {block}: expected "
                    f"{block_end - block_start} bytes, the long-term store returned {len(data)}"
                )
            if crc32c(data) != expected:
                raise DataCorruptionError(
                    f"offloaded chunk {chunk.location} block {block} (segment bytes "
                    f"{chunk.start_offset + block_start}..{chunk.start_offset + block_end}) "
                    f"failed its CRC32C check; refusing to return it"
                )
            return data

        return await trio.to_thread.run_sync(fetch_and_verify, limiter=self._store.tier2_limiter)

    async def index_of(self, chunk: Any, *, cached: bool = True) -> Any:
        """The chunk's ``OffloadIndex``, fetched once and cached, checked against the
        record; ``cached=False`` (fsck) reads the object again."""
        long_term = self._require_long_term()
        keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)

        async def fetch() -> bytes:
            return await trio.to_thread.run_sync(
                long_term.read_all, keys.index, limiter=self._store.tier2_limiter
            )

        if not cached:
            return decode_index(await fetch(), chunk, long_term.url_of(keys.index))
        index = self._indexes.get(keys.index)
        if index is None:  # the key names one attempt of one chunk: its checks hold for good
            raw = await self._index_cache.get(keys.index, fetch)
            index = decode_index(raw, chunk, long_term.url_of(keys.index))
            self._indexes[keys.index] = index
        return index

    # ------------------------------------------------------------------ policies
    def chunk_facts(self, seg: SegmentState, chunks: list[Any]) -> list[ChunkFacts]:
        """Chunk facts for the planners. A chunk is sealed once a later chunk exists
        (sealed when that one was created), or when its segment is sealed and every
        byte is flushed (sealed when the segment was)."""
        facts = []
        fully_flushed = seg.flushed_length == seg.durable_length == seg.appended_length
        for i, chunk in enumerate(chunks):
            sealed_at: float | None = None
            if i + 1 < len(chunks):
                sealed_at = chunks[i + 1].created_ns / 1e9
            elif seg.sealed and fully_flushed and not seg.sealing:
                sealed_at = (seg.record.sealed_ns or seg.record.modified_ns) / 1e9
            facts.append(ChunkFacts(int(chunk.start_offset), int(chunk.length), sealed_at,
                                    bool(chunk.offload_complete)))
        return facts

    async def scan(self) -> None:
        """One evaluation of the deletion lag, retention and offload policies."""
        store = self._store
        now_s = store.clock()
        await self._delete_due_hot_copies(now_s)
        oldest_waiting: float | None = None
        for seg, policy in store.segments_with_policy():
            chunks = await store.chunks_of(seg)
            facts = self.chunk_facts(seg, chunks)
            expire = head_chunks_to_expire(facts, policy, now_s, seg.durable_length)
            if expire and seg.segment_id not in self._running:
                expired = chunks[:expire]
                await store.truncate_head(seg, expired)
                self.retention_deleted_chunks += len(expired)
                self.retention_deleted_bytes += sum(int(c.length) for c in expired)
                facts = facts[expire:]
            if self.long_term is None:
                continue
            starts = chunks_to_offload(facts, policy, now_s, seg.durable_length)
            for fact in facts:
                if fact.start in starts and fact.sealed_at_s is not None:
                    oldest_waiting = min(oldest_waiting or fact.sealed_at_s, fact.sealed_at_s)
            if starts and seg.segment_id not in self._running:
                self._start_job(seg, starts, "policy")
        self.oldest_waiting_s = 0.0 if oldest_waiting is None else max(0.0, now_s - oldest_waiting)


def _hot_copies_pending(metadata: Any) -> dict[tuple[int, int], float]:
    """Offloaded chunks whose chunk-store copy still exists (read at start-up)."""
    return {
        (int(c.segment_id), int(c.start_offset)): c.offload_completed_ns / 1e9
        for c in metadata.all_chunks()
        if c.offload_complete and not c.offload_hot_deleted
    }


def _copy(record: Any) -> Any:
    new = type(record)()
    new.CopyFrom(record)
    return new
