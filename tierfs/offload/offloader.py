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

Each delete that a commit follows (step 1, step 6) is registered in the ``RemovalLog``
until that commit ended, so an orphan sweep that races it does not count the object.

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
- Policies and the deletion lag are evaluated by the ``PolicyScheduler`` every
  ``policy_interval_s`` against the injected wall clock (tests move that clock); the
  offloader runs the jobs it starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    ConcurrentModificationError,
    DataCorruptionError,
    InvalidArgumentError,
    OffloadRunningError,
    TierFSError,
    single_error,
)
from tierfs.engine.faults import crash_point
from tierfs.engine.object_keys import OffloadKeys, is_pack_name, new_attempt_uuid
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.engine.upkeep.removals import RemovalLog
from tierfs.offload.longterm import LongTermStore
from tierfs.offload.offload_format import encode_index, object_metadata
from tierfs.offload.planning import chunk_facts

log = logging.getLogger(__name__)

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"


class OffloadCatalogue(Protocol):
    """What the offloader needs of the metadata."""

    async def chunks_of(self, seg: SegmentState) -> list[Chunk]: ...

    async def commit_chunk(self, seg: SegmentState, chunk: Chunk) -> None: ...

    async def hot_copies_pending(self) -> dict[tuple[int, int], float]: ...


def require_long_term(long_term: LongTermStore | None) -> LongTermStore:
    if long_term is None:
        raise InvalidArgumentError(
            "no long-term store is configured: start tierfs with --offload-to URL "
            "(or offload_url in the config)"
        )
    return long_term


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
    def __init__(
        self,
        config: StoreConfig,
        long_term: LongTermStore | None,
        chunk_storage: ChunkStorage,
        tier2_limiter: trio.CapacityLimiter,
        catalogue: OffloadCatalogue,
        segment_by_id: Callable[[int], SegmentState | None],
        flush: Callable[[SegmentState], Awaitable[None]],
        clock: Callable[[], float],
        removals: RemovalLog,
    ) -> None:
        self._config = config
        self._removals = removals
        self.long_term = long_term
        self.chunk_storage = chunk_storage
        self._limiter = tier2_limiter
        self._catalogue = catalogue
        self._segment_by_id = segment_by_id
        self._flush = flush  # journal sync + tier-2 flush of one segment
        self._clock = clock  # wall-clock seconds: completion times, the deletion lag
        self._jobs: dict[int, OffloadJob] = {}  # by segment id
        self._running: set[int] = set()
        self._chunk_limiter = trio.CapacityLimiter(config.offload_concurrency)
        # (segment id, chunk start) -> completion time (s) of offloads whose
        # chunk-store copy still exists
        self._hot_pending: dict[tuple[int, int], float] = {}
        self._nursery: trio.Nursery | None = None
        self.uploading: set[str] = set()  # long-term keys being written right now
        self.offloaded_bytes = 0
        self.offloaded_chunks = 0
        self.failures = 0
        self.hot_copies_deleted = 0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the offloads whose hot copy still exists, then run jobs until cancelled."""
        self._hot_pending.update(await self._catalogue.hot_copies_pending())
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def _require_long_term(self) -> LongTermStore:
        return require_long_term(self.long_term)

    # ------------------------------------------------------------------ jobs
    def status(self, seg: SegmentState) -> dict[str, Any]:
        job = self._jobs.get(seg.segment_id, OffloadJob())
        chunks = seg.chunks or []
        facts = chunk_facts(seg, chunks)
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
        if seg.sealed and seg.flushed_length < seg.durable_length:
            await self._flush(seg)  # its last chunk is sealed once it holds everything
        chunks = await self._catalogue.chunks_of(seg)
        if seg.segment_id in self._running:  # started while we flushed
            raise OffloadRunningError(seg.name)
        starts = [
            fact.start for fact in chunk_facts(seg, chunks)
            if fact.sealed_at_s is not None and not fact.offloaded
            and (up_to is None or fact.start + fact.length <= up_to)
        ]
        self.start_job(seg, starts, "manual")
        return self.status(seg)

    def start_job(self, seg: SegmentState, starts: list[int], trigger: str) -> None:
        assert self._nursery is not None and seg.chunks is not None
        lengths = {c.start_offset: c.length for c in seg.chunks}
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
            await self.delete_due_hot_copies(self._clock(), seg.segment_id)
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
        await self._catalogue.chunks_of(seg)
        chunk = seg.chunk_at(start)
        if seg.deleted or chunk is None:
            return 0  # deleted, or expired by retention, meanwhile
        if chunk.offload_complete:
            return chunk.length
        earlier = chunk.offload_attempt_uuid
        attempt = new_attempt_uuid()
        with self._removals.removing(_attempt_keys(chunk.name, earlier)):
            if earlier:
                await self._delete_attempt_objects(chunk.name, earlier)
            async with seg.meta_lock:
                current = seg.chunk_at(start)
                if seg.deleted or current is None:
                    return 0
                if current.offload_complete or current.offload_attempt_uuid != earlier:
                    raise ConcurrentModificationError(
                        f"chunk {chunk.name} of {seg.name!r} changed while its offload started"
                    )
                recorded = dataclasses.replace(current, offload_attempt_uuid=attempt)
                await self._catalogue.commit_chunk(seg, recorded)
        crash_point("offload.attempt_recorded")

        keys = OffloadKeys.for_attempt(recorded.name, attempt)
        data = await trio.to_thread.run_sync(
            self._read_verified, recorded, limiter=self._limiter
        )
        await self._put(long_term, keys.data, data)
        del data
        crash_point("offload.data_uploaded")
        index = encode_index(seg.name, recorded, attempt)
        await self._put(long_term, keys.index, index)
        crash_point("offload.index_uploaded")

        async with seg.meta_lock:
            current = seg.chunk_at(start)
            lost = (
                seg.deleted or current is None or current.offload_attempt_uuid != attempt
                or current.length != recorded.length or current.name != recorded.name
            )
            if not lost:
                assert current is not None
                done = dataclasses.replace(
                    current,
                    offload_complete=True,
                    location=long_term.url_of(keys.data),
                    offload_completed_ns=int(self._clock() * 1e9),
                )
                await self._catalogue.commit_chunk(seg, done)
        if lost:
            if not seg.deleted and current is not None:
                with self._removals.removing(_attempt_keys(recorded.name, attempt)):
                    await self._delete_attempt_objects(recorded.name, attempt)
            if seg.deleted or current is None:
                return 0
            raise ConcurrentModificationError(
                f"chunk {recorded.name} of {seg.name!r} changed during its offload; "
                f"attempt {attempt} abandoned"
            )
        self.offloaded_bytes += done.length
        self.offloaded_chunks += 1
        crash_point("offload.completed")
        self._hot_pending[(seg.segment_id, start)] = done.offload_completed_ns / 1e9
        if self._config.offload_deletion_lag_s == 0:
            await self._delete_hot_copy(seg, start)
        return done.length

    async def _put(self, long_term: LongTermStore, key: str, data: bytes) -> None:
        """Upload one object; its key is in ``uploading`` meanwhile (orphan collection
        never touches an object being written)."""
        self.uploading.add(key)
        try:
            await trio.to_thread.run_sync(long_term.put, key, data, object_metadata())
        finally:
            self.uploading.discard(key)

    def _read_verified(self, chunk: Chunk) -> bytes:
        """The chunk's committed bytes from the chunk store, every block CRC-checked
        (a damaged chunk is never copied to the long-term store)."""
        length = chunk.length
        place = chunk.object_offset  # a packed chunk's place in its pack
        data = self.chunk_storage.read(chunk.name, place, place + length)
        if len(data) != length:
            raise DataCorruptionError(
                f"chunk {chunk.name}: the chunk store returned {len(data)} of {length} bytes"
            )
        view = memoryview(data)
        for block, expected in enumerate(chunk.block_crc32c):
            block_start = block * BLOCK_BYTES
            piece = view[block_start : block_start + BLOCK_BYTES]
            address = BlockAddress(f"chunk {chunk.name}", block, chunk.start_offset + block_start)
            verified_block(piece, len(piece), expected, address, "the chunk store")
        return data

    async def _delete_attempt_objects(self, chunk_name: str, attempt: str) -> None:
        long_term = self._require_long_term()
        for key in _attempt_keys(chunk_name, attempt):
            await trio.to_thread.run_sync(long_term.delete, key)

    async def _delete_hot_copy(self, seg: SegmentState, start: int) -> None:
        await self._catalogue.chunks_of(seg)
        chunk = seg.chunk_at(start)
        if seg.deleted or chunk is None or not chunk.offload_complete or chunk.offload_hot_deleted:
            self._hot_pending.pop((seg.segment_id, start), None)
            return
        packed = is_pack_name(chunk.name)  # a pack holds other chunks: the orphan sweep deletes it
        with self._removals.removing([] if packed else [chunk.name]):
            if not packed:
                await trio.to_thread.run_sync(
                    self.chunk_storage.delete, chunk.name, limiter=self._limiter
                )
            crash_point("offload.hot_deleted")
            async with seg.meta_lock:
                current = seg.chunk_at(start)
                if not seg.deleted and current is not None and current.name == chunk.name:
                    updated = dataclasses.replace(current, offload_hot_deleted=True)
                    await self._catalogue.commit_chunk(seg, updated)
        self._hot_pending.pop((seg.segment_id, start), None)
        self.hot_copies_deleted += 1

    def chunks_moved(self, moves: dict[tuple[int, int], tuple[int, int]]) -> None:
        """A concat re-addressed chunks: (segment id, start) before -> after."""
        for before, after in moves.items():
            if before in self._hot_pending:
                self._hot_pending[after] = self._hot_pending.pop(before)

    def is_running(self, seg: SegmentState) -> bool:
        return seg.segment_id in self._running

    async def delete_due_hot_copies(self, now_s: float, segment_id: int | None = None) -> None:
        """Delete the chunk-store copies whose deletion lag has passed (of one segment,
        or of all)."""
        lag_s = self._config.offload_deletion_lag_s
        for (owner, start), completed_s in list(self._hot_pending.items()):
            if (segment_id is None or owner == segment_id) and now_s - completed_s >= lag_s:
                seg = self._segment_by_id(owner)
                if seg is None:
                    self._hot_pending.pop((owner, start), None)
                else:
                    await self._delete_hot_copy(seg, start)


def _attempt_keys(chunk_name: str, attempt: str) -> tuple[str, ...]:
    """The long-term keys of one offload attempt (none without an attempt)."""
    return OffloadKeys.for_attempt(chunk_name, attempt).both if attempt else ()
