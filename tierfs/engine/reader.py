"""The read path: (segment, offset range) -> bytes from chunks and the unflushed tail.

Resolution: the range below the flushed length comes from chunks (binary search over
chunk start offsets), fetched as aligned 1 MiB blocks through the shared block cache,
in parallel; the range above comes from the tail (memory, or the journal for evicted
entries).

Invariants:
- Every byte returned was verified: chunk blocks against their CRC32C before entering
  the cache, journal frames against their frame CRC; tail bytes in memory are the bytes
  the appender handed over.
- The tail is captured synchronously together with the flushed length, so a flush that
  completes meanwhile cannot make a byte disappear or appear twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.contracts.errors import (
    ChunkMissingError,
    DataCorruptionError,
    JournalCorruptionError,
    TierFSError,
    single_error,
)
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.tail import TailEntry

if TYPE_CHECKING:
    from tierfs.store.facade import SegmentStore

TailPart = bytes | tuple[TailEntry, int, int]

MAX_TAIL_RETRIES = 3  # a flush can race a journal read-back at most a few times


class Reader:
    def __init__(self, store: SegmentStore) -> None:
        self._store = store
        self._prefetching: set[tuple[str, int, int]] = set()

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
        tail_parts = self.capture_tail(seg, max(start, flushed), end)
        pieces: list[bytes] = []
        if min(end, flushed) > start:
            pieces.append(await self.read_chunks(seg, start, min(end, flushed)))
        pieces.extend(await self.resolve_tail(tail_parts))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def capture_tail(self, seg: SegmentState, start: int, end: int) -> list[TailPart]:
        """Synchronously take the tail's bytes for [start, end): in-memory slices, or
        references to entries that must be re-read from the journal."""
        parts: list[TailPart] = []
        covered = 0
        if end <= start:
            return parts
        for entry, lo, hi in seg.tail.pieces(start, end):
            parts.append(entry.data[lo:hi] if entry.data is not None else (entry, lo, hi))
            covered += hi - lo
        if covered != end - start:
            raise AssertionError(f"tail of {seg.name!r} does not cover {start}..{end}")
        return parts

    async def resolve_tail(self, parts: list[TailPart]) -> list[bytes]:
        """Turn captured tail parts into bytes; evicted entries are re-read from the
        journal together, in one worker-thread call."""
        evicted = [part for part in parts if not isinstance(part, bytes)]
        if not evicted:
            return [part for part in parts if isinstance(part, bytes)]
        reread = await trio.to_thread.run_sync(
            self._store.journal.read_entries, [entry for entry, _, _ in evicted]
        )
        by_entry = iter(reread)
        pieces = []
        for part in parts:
            if isinstance(part, bytes):
                pieces.append(part)
            else:
                _, lo, hi = part
                pieces.append(next(by_entry)[lo:hi])
        return pieces

    async def tail_bytes(self, seg: SegmentState, start: int, end: int) -> bytes:
        return b"".join(await self.resolve_tail(self.capture_tail(seg, start, end)))

    def _blocks(self, chunks: list[Any], seg: SegmentState, start: int, end: int) -> list[tuple[Any, int]]:
        """(chunk, block index) of every block overlapping segment bytes [start, end)."""
        wanted: list[tuple[Any, int]] = []
        index = max(seg.chunk_index_at(start), 0)
        while index < len(chunks) and chunks[index].start_offset < end:
            chunk = chunks[index]
            lo = max(start, chunk.start_offset) - chunk.start_offset
            hi = min(end, chunk.start_offset + chunk.length) - chunk.start_offset
            for block in range(lo // BLOCK_BYTES, (hi - 1) // BLOCK_BYTES + 1):
                wanted.append((chunk, block))
            index += 1
        return wanted

    async def read_chunks(self, seg: SegmentState, start: int, end: int) -> bytes:
        chunks = await self._store.chunks_of(seg)
        try:
            return await self._read_chunks(seg, chunks, start, end)
        except ChunkMissingError:
            # An offload completed meanwhile and the chunk-store copy is gone (deletion
            # lag 0): the records now point at the long-term copy; resolve again.
            if seg.chunks is chunks:
                raise
            return await self._read_chunks(seg, await self._store.chunks_of(seg), start, end)

    async def _read_chunks(self, seg: SegmentState, chunks: list[Any], start: int, end: int) -> bytes:
        wanted = self._blocks(chunks, seg, start, end)
        blocks: list[bytes] = [b""] * len(wanted)
        cache = self._store.block_cache
        keys = [block_key(chunk, block) for chunk, block in wanted]

        async def fetch(i: int) -> None:
            blocks[i] = await self.block(wanted[i][0], wanted[i][1])

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

    def prefetch(self, seg: SegmentState, start: int, end: int, nursery: trio.Nursery) -> int:
        """Start background fetches of the flushed blocks in [start, end) that are
        neither cached nor in flight; returns how many were started. Errors are left
        for the read that needs the block to see."""
        end = min(end, seg.flushed_length)
        if seg.chunks is None or end <= start:
            return 0
        cache = self._store.block_cache
        started = 0
        for chunk, block in self._blocks(seg.chunks, seg, start, end):
            key = block_key(chunk, block)
            if key not in self._prefetching and not cache.has(key):
                self._prefetching.add(key)  # before the task runs: no duplicate tasks
                cache.prefetches += 1
                nursery.start_soon(self._prefetch_block, chunk, block, key)
                started += 1
        return started

    async def _prefetch_block(self, chunk: Any, block: int, key: tuple[str, int, int]) -> None:
        try:
            await self.block(chunk, block)
        except TierFSError:
            pass  # the reader that needs this block will fetch it again and see the error
        finally:
            self._prefetching.discard(key)

    async def block(self, chunk: Any, block: int) -> bytes:
        """One verified block of a chunk, through the shared cache."""
        block_start = block * BLOCK_BYTES
        block_end = min(block_start + BLOCK_BYTES, int(chunk.length))
        key = block_key(chunk, block)
        store = self._store
        if chunk.location:  # offloaded: the same bytes, so the same cache key
            return await store.block_cache.get(key, lambda: store.offloader.read_block(chunk, block))

        def fetch_and_verify() -> bytes:
            """In the worker thread: the GET and the CRC, off the event loop."""
            data = store.chunk_storage.read(chunk.name, block_start, block_end)
            if len(data) != block_end - block_start:
                raise DataCorruptionError(
                    f"chunk {chunk.name} block {block}: expected {block_end - block_start} "
                    f"bytes, tier-2 returned {len(data)}"
                )
            if crc32c(data) != chunk.block_crc32c[block]:
                raise DataCorruptionError(
                    f"chunk {chunk.name} block {block} (segment bytes "
                    f"{chunk.start_offset + block_start}..{chunk.start_offset + block_end}) "
                    f"failed its CRC32C check; refusing to return it"
                )
            return data

        async def fetch() -> bytes:
            return await trio.to_thread.run_sync(fetch_and_verify, limiter=store.tier2_limiter)

        return await store.block_cache.get(key, fetch)


def block_key(chunk: Any, block: int) -> tuple[str, int, int]:
    """Cache key of a block: a growing chunk's last block is keyed by its length."""
    block_start = block * BLOCK_BYTES
    return (str(chunk.name), block, min(block_start + BLOCK_BYTES, int(chunk.length)) - block_start)
