"""Verified 1 MiB blocks of chunks, through the shared block cache.

A block of a chunk in the chunk store is one ranged read of tier-2 in a worker thread
(under the tier-2 limiter), checked by ``verified_block`` before it enters the cache. A
block of an offloaded chunk comes from the long-term store through ``LongTermBlocks``;
the bytes are the same, so it shares the cache key.

Invariants:
- Only verified blocks enter the cache; concurrent misses on one block make one read
  (the cache's single flight).
- A growing chunk's last block is keyed by its length, so a longer version of it is a
  different key and a stale short copy is never served for bytes it does not hold.
"""

from __future__ import annotations

import trio

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.engine.blockcache import BlockCache
from tierfs.engine.chunkstore import ChunkStorage
from tierfs.engine.ports import LongTermBlocks
from tierfs.engine.record_types import Chunk

BlockKey = tuple[str, int, int]


def block_key(chunk: Chunk, block: int) -> BlockKey:
    """Cache key of a block: a growing chunk's last block is keyed by its length."""
    block_start = block * BLOCK_BYTES
    return (chunk.name, block, min(block_start + BLOCK_BYTES, chunk.length) - block_start)


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

    async def block(self, chunk: Chunk, block: int) -> bytes:
        """One verified block of a chunk, through the shared cache."""
        key = block_key(chunk, block)
        if chunk.location:  # offloaded: the same bytes, so the same cache key
            long_term = self._long_term
            if long_term is None:
                raise InvalidArgumentError(
                    "no long-term store is configured: start tierfs with --offload-to URL "
                    "(or offload_url in the config)"
                )
            return await self.cache.get(key, lambda: long_term.read_block(chunk, block))
        block_start = block * BLOCK_BYTES
        block_end = min(block_start + BLOCK_BYTES, chunk.length)
        address = BlockAddress(f"chunk {chunk.name}", block, chunk.start_offset + block_start)
        expected_crc = chunk.block_crc32c[block]

        def fetch_and_verify() -> bytes:
            """In the worker thread: the GET and the CRC, off the event loop."""
            data = self.chunk_storage.read(chunk.name, block_start, block_end)
            return verified_block(data, block_end - block_start, expected_crc, address, "tier-2")

        async def fetch() -> bytes:
            return await trio.to_thread.run_sync(fetch_and_verify, limiter=self._limiter)

        return await self.cache.get(key, fetch)
