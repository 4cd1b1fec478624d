"""Verified 1 MiB blocks of chunks, through the shared block cache.

A block of a chunk in the chunk store is one ranged read of tier-2 in a worker thread
(under the tier-2 limiter), checked by ``verified_block`` before it enters the cache. A
block of an offloaded chunk comes from the long-term store through ``LongTermBlocks``;
the bytes are the same, so it shares the cache key.

A *run* (``fetch_run``, for sequential read-ahead) is several adjacent blocks of one
chunk read with one ranged GET: the keys are claimed in the cache before the GET
starts, and each block is checked and cached the moment its bytes arrive, so a reader
of any block of the run waits for that block only.

Invariants:
- Only verified blocks enter the cache; concurrent misses on one block make one read
  (the cache's single flight, for single blocks and runs alike).
- A block of a run that fails its check fails alone (``DataCorruptionError`` naming
  it); the run goes on and its other blocks are cached. A run that ends early (error,
  cancellation) fails the blocks it did not bring with that error.
- A growing chunk's last block is keyed by its length, so a longer version of it is a
  different key and a stale short copy is never served for bytes it does not hold.
- A chunk packed with others into one object (``Chunk.object_offset``) is read at its
  place there and keyed by it too, so two chunks of one pack never share a key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.errors import DataCorruptionError, InvalidArgumentError
from tierfs.engine.ports import LongTermBlocks
from tierfs.engine.read.block_cache import BlockCache, Flight
from tierfs.engine.record_types import Chunk
from tierfs.engine.tier2.chunk_storage import ChunkStorage

BlockKey = tuple[str, int, int]
RunReader = Callable[[Sequence[tuple[int, int]], Callable[[int, bytes], None]], None]


def block_key(chunk: Chunk, block: int) -> BlockKey:
    """Cache key of a block: a growing chunk's last block is keyed by its length, a
    packed chunk's by its place in the pack."""
    block_start = block * BLOCK_BYTES
    name = f"{chunk.name}@{chunk.object_offset}" if chunk.object_offset else chunk.name
    return (name, block, min(block_start + BLOCK_BYTES, chunk.length) - block_start)


def block_span(chunk: Chunk, block: int) -> tuple[int, int]:
    """Chunk bytes [start, end) of a block."""
    block_start = block * BLOCK_BYTES
    return block_start, min(block_start + BLOCK_BYTES, chunk.length)


class BlockSource:
    def __init__(
        self,
        cache: BlockCache,
        chunk_storage: ChunkStorage,
        tier2_limiter: trio.CapacityLimiter,
        long_term: LongTermBlocks | None = None,
    ) -> None:
        self.cache = cache
        self.chunk_storage = chunk_storage
        self._limiter = tier2_limiter
        self._long_term = long_term

    def _long_term_of(self) -> LongTermBlocks:
        if self._long_term is None:
            raise InvalidArgumentError(
                "no long-term store is configured: start tierfs with --offload-to URL "
                "(or offload_url in the config)"
            )
        return self._long_term

    async def block(self, chunk: Chunk, block: int) -> bytes:
        """One verified block of a chunk, through the shared cache."""
        key = block_key(chunk, block)
        if chunk.location:  # offloaded: the same bytes, so the same cache key
            long_term = self._long_term_of()
            return await self.cache.get(key, lambda: long_term.read_block(chunk, block))
        block_start, block_end = block_span(chunk, block)
        address = BlockAddress(f"chunk {chunk.name}", block, chunk.start_offset + block_start)
        expected_crc = chunk.block_crc32c[block]

        def fetch_and_verify() -> bytes:
            """In the worker thread: the GET and the CRC, off the event loop."""
            place = chunk.object_offset
            data = self.chunk_storage.read(chunk.name, place + block_start, place + block_end)
            return verified_block(data, block_end - block_start, expected_crc, address, "tier-2")

        async def fetch() -> bytes:
            return await trio.to_thread.run_sync(fetch_and_verify, limiter=self._limiter)

        return await self.cache.get(key, fetch)

    def claim_run(self, chunk: Chunk, first: int, count: int) -> list[Flight]:
        """Claim blocks ``first .. first + count - 1`` (none cached or in flight: the
        caller checked) for one ``fetch_run``; synchronous, so nothing else starts a
        fetch of them in between."""
        return self.cache.claim([block_key(chunk, block) for block in range(first, first + count)])

    async def fetch_run(self, chunk: Chunk, first: int, flights: list[Flight]) -> None:
        """Fetch the claimed blocks with one ranged read; each is verified and cached
        (its flight completed) as it arrives. Errors go to the blocks' readers."""
        cache = self.cache
        blocks = range(first, first + len(flights))
        keys = [block_key(chunk, block) for block in blocks]
        error: BaseException | None = None
        try:
            if chunk.location:
                long_term = self._long_term_of()
                crcs: Sequence[int] = await long_term.block_crc32c(chunk)
                source, origin = f"offloaded chunk {chunk.location}", "the long-term store"
                read: RunReader = lambda spans, sink: long_term.read_blocks(chunk, spans, sink)  # noqa: E731
            else:
                crcs, source, origin = chunk.block_crc32c, f"chunk {chunk.name}", "tier-2"
                place = chunk.object_offset
                read = lambda spans, sink: self.chunk_storage.read_blocks(  # noqa: E731
                    chunk.name, [(start + place, end + place) for start, end in spans], sink)
            token = trio.lowlevel.current_trio_token()
            spans = [block_span(chunk, block) for block in blocks]

            def on_block(index: int, data: bytes) -> None:
                """In a worker thread or the S3 client's loop: check, then hand to trio."""
                block = first + index
                address = BlockAddress(source, block, chunk.start_offset + spans[index][0])
                try:
                    verified = verified_block(data, spans[index][1] - spans[index][0], crcs[block], address, origin)
                except DataCorruptionError as e:
                    token.run_sync_soon(cache.fail, keys[index], flights[index], e)
                    return
                token.run_sync_soon(cache.complete, keys[index], flights[index], verified)

            await trio.to_thread.run_sync(read, spans, on_block, limiter=self._limiter)
        except Exception as e:
            error = e
        except BaseException:
            error = trio.TooSlowError("the fetch of this block was cancelled")
            raise
        finally:
            # Deliveries were queued (run_sync_soon) before the thread reported back,
            # so they ran first: what is still in flight was never brought.
            for key, flight in zip(keys, flights, strict=True):
                if not flight.done.is_set():
                    cache.fail(key, flight, error or DataCorruptionError(
                        f"a ranged read of {chunk.name} ended without block {key[1]}"))
