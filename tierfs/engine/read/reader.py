"""The read path: (segment, offset range) -> bytes from chunks and the unflushed tail.

Resolution: the range below the flushed length comes from chunks (binary search over
chunk start offsets), fetched as aligned 1 MiB blocks from the ``BlockSource`` (shared
cache, verified), in parallel; the range above comes from the tail (``TailReader``:
memory, or the journal for evicted entries).

Invariants:
- Ordinary reads stop at the durable length (LAC); only ``unconfirmed`` reads go up to
  the appended length (LAP). Arguments are checked before anything is read.
- Every byte returned was verified: chunk blocks against their CRC32C before entering
  the cache, journal frames against their frame CRC; tail bytes in memory are the bytes
  the appender handed over.
- The tail is captured synchronously together with the flushed length, so a flush that
  completes meanwhile cannot make a byte disappear or appear twice.
- Prefetches run in the nursery bound by the store while it is open; their errors are
  left for the read that needs the block. A prefetch claims its blocks in the cache
  before it starts (a run of adjacent blocks is one ranged GET), so a read of a block
  being prefetched waits for it instead of fetching it again.
"""

from __future__ import annotations

import bisect
import operator

import trio

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.contracts.arguments import check_read_window
from tierfs.contracts.errors import (
    ChunkMissingError,
    DataCorruptionError,
    JournalCorruptionError,
    OffsetOutOfRangeError,
    TruncatedError,
    single_error,
)
from tierfs.engine.ports import ChunkSource
from tierfs.engine.read.block_source import BlockSource, block_key
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail_reader import TailReader

MAX_TAIL_RETRIES = 3  # a flush can race a journal read-back at most a few times
_start_offset = operator.attrgetter("start_offset")


class Reader:
    def __init__(self, chunks: ChunkSource, blocks: BlockSource, tail: TailReader) -> None:
        self._chunks = chunks
        self._blocks = blocks
        self._tail = tail
        self._nursery: trio.Nursery | None = None

    def bind(self, nursery: trio.Nursery | None) -> None:
        """Prefetches run in ``nursery`` from now on (None: no more prefetches)."""
        self._nursery = nursery

    async def read_segment(
        self, seg: SegmentState, offset: int, length: int | None, *, unconfirmed: bool = False
    ) -> bytes:
        """Bytes from ``offset``, at most ``length`` (None: to the end); b'' at the end."""
        check_read_window(offset, length)
        limit = seg.appended_length if unconfirmed else seg.durable_length
        if offset > limit:
            raise OffsetOutOfRangeError(seg.name, offset, limit)
        end = limit if length is None else min(limit, offset + length)
        if end == offset:
            await trio.lowlevel.checkpoint()
            return b""
        if offset < seg.start_offset:
            raise TruncatedError(seg.name, offset, seg.start_offset)
        data = await self.read(seg, offset, end)
        await trio.lowlevel.checkpoint()  # a read served from memory yields too
        return data

    async def read(self, seg: SegmentState, start: int, end: int) -> bytes:
        for attempt in range(MAX_TAIL_RETRIES):
            try:
                return await self._read_once(seg, start, end)
            except (JournalCorruptionError, FileNotFoundError):
                # The journal file was deleted after a flush moved the bytes to tier-2;
                # the bytes are now in chunks, resolve again.
                if attempt == MAX_TAIL_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    async def _read_once(self, seg: SegmentState, start: int, end: int) -> bytes:
        flushed = seg.flushed_length
        tail_parts = self._tail.capture(seg, max(start, flushed), end)
        pieces: list[bytes] = []
        if min(end, flushed) > start:
            pieces.append(await self.read_chunks(seg, start, min(end, flushed)))
        pieces.extend(await self._tail.resolve(tail_parts))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    @staticmethod
    def _blocks_of(chunks: list[Chunk], start: int, end: int) -> list[tuple[Chunk, int]]:
        """(chunk, block index) of every block overlapping segment bytes [start, end)
        (``chunks``: records by offset that cover the range, and maybe more)."""
        wanted: list[tuple[Chunk, int]] = []
        index = max(bisect.bisect_right(chunks, start, key=_start_offset) - 1, 0)
        while index < len(chunks) and chunks[index].start_offset < end:
            chunk = chunks[index]
            lo = max(start, chunk.start_offset) - chunk.start_offset
            hi = min(end, chunk.start_offset + chunk.length) - chunk.start_offset
            for block in range(lo // BLOCK_BYTES, (hi - 1) // BLOCK_BYTES + 1):
                wanted.append((chunk, block))
            index += 1
        return wanted

    async def read_chunks(self, seg: SegmentState, start: int, end: int) -> bytes:
        chunks = self._covering(seg, start, end)
        while True:
            try:
                return await self._read_chunks(seg, chunks, start, end)
            except ChunkMissingError:
                # An offload completed or a defrag swapped chunks meanwhile and the old
                # object is gone (deletion lag 0): the records now point at the
                # long-term copy or the merged chunk; resolve again, as long as the
                # records keep changing (a defrag swaps one run after another).
                again = self._covering(seg, start, end)
                if again == chunks:
                    raise
                chunks = again

    def _covering(self, seg: SegmentState, start: int, end: int) -> list[Chunk]:
        chunks = self._chunks.chunks_covering(seg, start, end)
        if (not chunks or chunks[0].start_offset > start) and start < seg.start_offset:
            raise TruncatedError(seg.name, start, seg.start_offset)  # retention, meanwhile
        return chunks

    async def _read_chunks(self, seg: SegmentState, chunks: list[Chunk], start: int, end: int) -> bytes:
        wanted = self._blocks_of(chunks, start, end)
        blocks: list[bytes] = [b""] * len(wanted)
        cache = self._blocks.cache
        keys = [block_key(chunk, block) for chunk, block in wanted]

        async def fetch(i: int) -> None:
            blocks[i] = await self._blocks.block(wanted[i][0], wanted[i][1])

        cache.pin(keys)
        try:
            if len(wanted) == 1:
                await fetch(0)
            else:
                with single_error():
                    async with trio.open_nursery() as nursery:
                        for i in range(len(wanted)):
                            nursery.start_soon(fetch, i)
        finally:
            cache.unpin(keys)
        if len(blocks) == 1 and len(blocks[0]) == end - start:
            return blocks[0]  # exactly one whole cached block: no copy (blocks are immutable)
        views = []
        for (chunk, block), data in zip(wanted, blocks, strict=True):
            block_start = chunk.start_offset + block * BLOCK_BYTES
            lo = max(start, block_start) - block_start
            hi = min(end, block_start + len(data)) - block_start
            views.append(memoryview(data)[lo:hi])
        out = b"".join(views)  # the one copy of the bytes
        if len(out) != end - start:
            raise DataCorruptionError(
                f"chunks of {seg.name!r} cover only {len(out)} of bytes {start}..{end}"
            )
        return out

    def prefetch(self, seg: SegmentState, start: int, end: int, run_blocks: int = 1) -> int:
        """Start background fetches of the flushed blocks in [start, end) that are
        neither cached nor in flight, adjacent missing blocks of one chunk ``run_blocks``
        at a time with one ranged GET each; returns how many blocks were started.

        A run shorter than ``run_blocks`` at the end of the range is left for a later
        call (the range moves on as the reader does) unless it reaches the end of its
        chunk or of the flushed bytes, so a steadily advancing reader tops its window
        up in whole runs rather than one block at a time."""
        end = min(end, seg.flushed_length)
        nursery = self._nursery
        if nursery is None or seg.deleted or end <= start:
            return 0
        run_blocks = max(1, run_blocks)
        cache = self._blocks.cache
        runs: list[tuple[Chunk, int, int]] = []  # (chunk, first block, count)
        for chunk, block in self._blocks_of(self._chunks.chunks_covering(seg, start, end), start, end):
            if cache.has(block_key(chunk, block)):
                continue
            if runs:
                last_chunk, first, count = runs[-1]
                if last_chunk is chunk and first + count == block and count < run_blocks:
                    runs[-1] = (chunk, first, count + 1)
                    continue
            runs.append((chunk, block, 1))
        if runs:
            chunk, first, count = runs[-1]
            run_end = (first + count) * BLOCK_BYTES  # in the chunk
            can_grow = run_end < chunk.length and chunk.start_offset + run_end >= end
            if count < run_blocks and can_grow and end < seg.flushed_length:
                runs.pop()  # topped up to a whole run once the reader moves on
        started = 0
        for chunk, first, count in runs:
            flights = self._blocks.claim_run(chunk, first, count)  # before the task runs
            cache.prefetches += count
            # its errors go to the readers waiting on these blocks (fetch_run)
            nursery.start_soon(self._blocks.fetch_run, chunk, first, flights)
            started += count
        return started
