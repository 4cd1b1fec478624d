"""Flushing planned pieces: one segment's, or many small segments' in one batch.

``ChunkFlusher.flush(segments)`` moves the next piece of each segment (``flush.plan``)
into tier-2 and commits them:

1. plan   - each segment's piece (chunk records are cached, so no I/O for them), its
            durable bytes read from the tail (memory, or CRC-checked journal frames);
2. check  - a passed owner-claim check no older than the check interval (normally
            the fence's periodic one: no request);
3. write  - on a store that cannot append (an object store, where every flush is a
            new object anyway), the new chunks of a batch (at least
            ``MIN_PACK_PIECES`` of at most ``PACK_PIECE_MAX_BYTES`` each) packed into
            one new object, a *pack* (``object_keys.pack_name``: one PUT instead of
            one per segment, each chunk record pointing at its place), the other
            pieces each to its own object (a store that appends grows a segment's
            last chunk in place instead, which a packed chunk could not);
            concurrently, each in a worker thread under the tier-2 limiter; a failed
            write fails only the segments whose bytes it carried;
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
- A segment deleted before its bytes were taken from its tail (a delete may run while
  its chunk records load, or its evicted appends are re-read) is left out of the batch;
  one deleted after is written, and its new chunk object is queued as garbage, never
  committed. A piece whose grown chunk was replaced meanwhile (an offload attempt
  started) is not committed (``ConcurrentModificationError``, retried by the writer).
- A pack is written once, under a name never used before, and is in
  ``packs_in_flight`` from before its write until its commit ended, so the orphan sweep
  (which deletes packs once no chunk record references them) never takes one that is
  about to be committed. No pack is ever grown or queued as garbage.
- Memory: the caller bounds a batch's bytes (``max_flush_bytes`` in all); a pack holds
  one more copy of them while it is written.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import ConcurrentModificationError, TierFSError
from tierfs.engine.clock import monotonic_s
from tierfs.engine.faults import crash_point
from tierfs.engine.flush.plan import FlushPiece, plan_flush
from tierfs.engine.locks import holding
from tierfs.engine.object_keys import is_pack_name, pack_name
from tierfs.engine.ownership.fencing import OwnerFence
from tierfs.engine.ports import GarbageSink
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail_reader import TailReader
from tierfs.engine.tier2.chunk_storage import ChunkStorage

log = logging.getLogger(__name__)

# Pieces up to one block share a pack: below that a PUT's fixed cost (a request, a few
# hundred microseconds of the S3 client's CPU) dominates; larger ones keep an object of
# their own, which defrag can copy inside S3.
PACK_PIECE_MAX_BYTES = 1 << 20
MIN_PACK_PIECES = 2  # a pack of one would be a chunk object with another name


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
        self.packs = 0  # pack objects written
        self.packs_in_flight: set[str] = set()  # written or being written, commit not ended

    async def flush(self, segs: list[SegmentState], storage: ChunkStorage) -> FlushOutcome:
        """Flush the next piece of each of ``segs`` (none deleted, each with durable
        unflushed bytes and its flush slot held by the caller). A fenced store, an
        unverifiable claim check or a failed transaction raise: then nothing of the
        batch was committed. Per-segment failures are in the outcome."""
        outcome = FlushOutcome()
        pieces = []
        for seg in segs:
            chunks = await self._catalogue.chunks_of(seg)  # may load them: a delete can run meanwhile
            if seg.deleted:
                continue  # its tail went with it
            piece = plan_flush(seg, chunks, self._config, self._epoch, storage.supports_append)
            try:
                piece.take(await self._tail.tail_bytes(seg, piece.start, piece.end))
            except (OSError, TierFSError):
                if seg.deleted:  # while its evicted appends were re-read: their journal file may be gone
                    continue
                raise
            pieces.append(piece)
        await self._fence.confirm_recent()
        objects = self._objects(pieces, packing=not storage.supports_append)
        try:
            written = await self._write(objects, storage, outcome)
            crash_point("flush.chunk_written")  # in tier-2, not committed: orphans if we die
            if written:
                await self._fence.confirm_since(monotonic_s())  # started after every write returned
                await self._commit(written, outcome)
        finally:
            self.packs_in_flight.difference_update(name for name, group in objects if len(group) > 1)
        return outcome

    def _objects(self, pieces: list[FlushPiece], *, packing: bool) -> list[tuple[str, list[FlushPiece]]]:
        """The objects to write: (name, the pieces it carries, in object order); with
        ``packing``, the small new chunks share one pack."""
        small = [p for p in pieces if not p.grows and len(p.data) <= PACK_PIECE_MAX_BYTES]
        if not packing or len(small) < MIN_PACK_PIECES:
            return [(p.name, [p]) for p in pieces]
        pack = pack_name(self._epoch)
        position = 0
        for piece in small:
            piece.pack_into(pack, position)
            position += len(piece.data)
        self.packs_in_flight.add(pack)
        return [(pack, small)] + [(p.name, [p]) for p in pieces if p not in small]

    async def _write(
        self, objects: list[tuple[str, list[FlushPiece]]], storage: ChunkStorage, outcome: FlushOutcome
    ) -> list[FlushPiece]:
        written: list[FlushPiece] = []

        async def write(name: str, group: list[FlushPiece]) -> None:
            if len(group) == 1:
                offset, data = group[0].chunk_offset, group[0].data
            else:
                offset, data = 0, b"".join(piece.data for piece in group)
                self.packs += 1
            try:
                await trio.to_thread.run_sync(storage.write, name, offset, data, limiter=self._limiter)
            except TierFSError as e:
                for piece in group:
                    outcome.failed[piece.seg] = e
            else:
                written.extend(group)

        if len(objects) == 1:
            await write(*objects[0])
        else:
            async with trio.open_nursery() as nursery:
                for name, group in objects:
                    nursery.start_soon(write, name, group)
        return written

    async def _commit(self, written: list[FlushPiece], outcome: FlushOutcome) -> None:
        async with holding([piece.seg.meta_lock for piece in sorted(written, key=lambda p: p.seg.segment_id)]):
            ready = []
            for piece in written:
                if piece.seg.deleted:
                    if not piece.grows and not is_pack_name(piece.name):  # a pack: the orphan sweep's
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
