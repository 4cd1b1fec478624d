"""Flushing planned pieces: one segment's, or many small segments' in one batch.

``ChunkFlusher.flush(segments)`` moves the next piece of each segment (``flush_plan``)
into tier-2 and commits them:

1. plan   - each segment's piece (chunk records are cached, so no I/O for them), its
            durable bytes read from the tail (memory, or CRC-checked journal frames);
2. check  - a passed owner-claim check no older than the check interval (normally
            the fence's periodic one: no request);
3. write  - every piece's bytes, concurrently, each in a worker thread under the tier-2
            limiter; a failed write fails only its segment;
4. verify - a passed claim check that started after the last write completed (one
            check shared by the whole batch and by every other flush waiting then);
            fenced or unverifiable: nothing is committed;
5. commit - under the segments' ``meta_lock``s (taken in segment-id order, as concat
            does), every written piece's chunk record and segment record in one
            metadata transaction, all or nothing; if it is refused because one segment's
            row changed, each piece is committed on its own so that only that one fails.

Invariants:
- Nothing is committed unless its bytes are in tier-2 and a claim check that started
  after they got there found this store the owner; a fenced store commits nothing and
  its pieces' bytes stay in the tails (and so go to lost+found).
- A commit is all or nothing: a segment's flushed length and its chunk record move
  together, and a batch's transaction either commits every piece or none.
- A deleted segment's new chunk object is queued as garbage, never committed; a piece
  whose grown chunk was replaced meanwhile (an offload attempt started) is not
  committed (``ConcurrentModificationError``, retried by the writer).
- Memory: the caller bounds a batch's bytes (``max_flush_bytes`` in all).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AsyncExitStack
from typing import Protocol

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import ConcurrentModificationError, TierFSError
from tierfs.engine.chunkstore import ChunkStorage
from tierfs.engine.clock import monotonic_s
from tierfs.engine.faults import crash_point
from tierfs.engine.fencing import OwnerFence
from tierfs.engine.flush_plan import FlushPiece, plan_flush
from tierfs.engine.ports import GarbageSink
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.tail_reader import TailReader

log = logging.getLogger(__name__)


class FlushCatalogue(Protocol):
    """What flushing needs of the metadata."""

    async def chunks_of(self, seg: SegmentState) -> list[Chunk]: ...

    async def commit_flushes(self, flushes: list[tuple[SegmentState, SegmentMeta, Chunk]]) -> None: ...


@dataclasses.dataclass
class FlushOutcome:
    committed: list[FlushPiece] = dataclasses.field(default_factory=list)
    failed: dict[SegmentState, TierFSError] = dataclasses.field(default_factory=dict)


class ChunkFlusher:
    def __init__(
        self,
        config: StoreConfig,
        epoch: int,
        tier2_limiter: trio.CapacityLimiter,
        catalogue: FlushCatalogue,
        tail: TailReader,
        garbage: GarbageSink,
        fence: OwnerFence,
    ) -> None:
        self._config = config
        self._epoch = epoch
        self._limiter = tier2_limiter
        self._catalogue = catalogue
        self._tail = tail
        self._garbage = garbage
        self._fence = fence
        self.commits = 0  # metadata transactions that committed flushes

    async def flush(self, segs: list[SegmentState], storage: ChunkStorage) -> FlushOutcome:
        """Flush the next piece of each of ``segs`` (none deleted, each with durable
        unflushed bytes and its flush slot held by the caller). A fenced store, an
        unverifiable claim check or a failed transaction raise: then nothing of the
        batch was committed. Per-segment failures are in the outcome."""
        outcome = FlushOutcome()
        pieces = []
        for seg in segs:
            chunks = await self._catalogue.chunks_of(seg)
            piece = plan_flush(seg, chunks, self._config, self._epoch, storage.supports_append)
            piece.take(await self._tail.tail_bytes(seg, piece.start, piece.end))
            pieces.append(piece)
        await self._fence.confirm_recent()
        written = await self._write(pieces, storage, outcome)
        crash_point("flush.chunk_written")  # in tier-2, not committed: orphans if we die
        if written:
            await self._fence.confirm_since(monotonic_s())  # started after every write returned
            await self._commit(written, outcome)
        return outcome

    async def _write(self, pieces: list[FlushPiece], storage: ChunkStorage, outcome: FlushOutcome) -> list[FlushPiece]:
        written: list[FlushPiece] = []

        async def write(piece: FlushPiece) -> None:
            try:
                await trio.to_thread.run_sync(
                    storage.write, piece.name, piece.chunk_offset, piece.data, limiter=self._limiter
                )
            except TierFSError as e:
                outcome.failed[piece.seg] = e
            else:
                written.append(piece)

        if len(pieces) == 1:
            await write(pieces[0])
        else:
            async with trio.open_nursery() as nursery:
                for piece in pieces:
                    nursery.start_soon(write, piece)
        return written

    async def _commit(self, written: list[FlushPiece], outcome: FlushOutcome) -> None:
        async with AsyncExitStack() as locks:
            for piece in sorted(written, key=lambda p: p.seg.segment_id):
                await locks.enter_async_context(piece.seg.meta_lock)
            ready = []
            for piece in written:
                if piece.seg.deleted:
                    if not piece.grows:
                        await self._garbage.queue([piece.name])
                elif piece.overtaken():
                    outcome.failed[piece.seg] = ConcurrentModificationError(
                        f"chunk {piece.name} of {piece.seg.name!r} changed during a flush; retrying"
                    )
                else:
                    ready.append(piece)
            # fenced while writing or checking: keep the bytes in the tails (and so in
            # lost+found); the objects just written are orphans of this epoch
            self._fence.ensure_owner()
            if not ready:
                return
            try:
                await self._commit_pieces(ready)
                outcome.committed.extend(ready)
            except ConcurrentModificationError:
                if len(ready) == 1:
                    raise
                log.info("a batched flush commit was refused (a segment changed); committing its %d pieces one by one",
                         len(ready))
                for piece in ready:
                    try:
                        await self._commit_pieces([piece])
                        outcome.committed.append(piece)
                    except ConcurrentModificationError as e:
                        outcome.failed[piece.seg] = e

    async def _commit_pieces(self, pieces: list[FlushPiece]) -> None:
        await self._catalogue.commit_flushes([(p.seg, p.record(), p.chunk(self._epoch)) for p in pieces])
        self.commits += 1
