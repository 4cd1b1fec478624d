"""Reads of offloaded chunks from the long-term store: 1 MiB ranged GETs, each block
checked against the block CRC32Cs of the chunk's index object.

Invariants:
- An index object is fetched once per attempt key and cached (raw bytes with single
  flight, decoded records in an LRU); ``decode_index`` checks it against the chunk
  record before it is trusted, so a cached index always matches its record.
- A block is returned only through ``verified_block``; it then enters the engine's
  shared block cache (the caller's ``BlockSource``). A run of adjacent blocks
  (``read_blocks``, sequential read-ahead) is one streamed ranged GET of the data
  object; the caller checks each block against ``block_crc32c`` (the index's).
- GETs run in worker threads under the tier-2 limiter.
"""

from __future__ import annotations

from collections.abc import Sequence

import cachetools
import trio

from tierfs.blocks.block_stream import BlockSink
from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.engine.object_keys import OffloadKeys
from tierfs.engine.read.block_cache import BlockCache
from tierfs.engine.record_types import Chunk
from tierfs.offload.longterm import LongTermStore
from tierfs.offload.offload_format import IndexObject, decode_index

INDEX_CACHE_BYTES = 8 << 20  # index objects are ~300 B + 4 B per MiB of chunk
INDEX_CACHE_ENTRIES = 4096


class LongTermReads:
    def __init__(self, long_term: LongTermStore, tier2_limiter: trio.CapacityLimiter) -> None:
        self.long_term = long_term
        self._limiter = tier2_limiter
        self._index_cache = BlockCache(INDEX_CACHE_BYTES)  # raw index objects, single flight
        # decoded and checked indexes: a block read does not parse its index again
        self._indexes: cachetools.LRUCache[str, IndexObject] = cachetools.LRUCache(
            maxsize=INDEX_CACHE_ENTRIES
        )

    async def read_block(self, chunk: Chunk, block: int) -> bytes:
        """One block of an offloaded chunk: a ranged GET, checked against the block
        CRC32C of the chunk's index object."""
        long_term = self.long_term
        index = await self.index_of(chunk)
        key = long_term.key_of(chunk.location)
        block_start = block * BLOCK_BYTES
        block_end = min(block_start + BLOCK_BYTES, chunk.length)
        expected = index.block_crc32c[block]
        address = BlockAddress(
            f"offloaded chunk {chunk.location}", block, chunk.start_offset + block_start
        )

        def fetch_and_verify() -> bytes:
            data = long_term.read(key, block_start, block_end)
            return verified_block(data, block_end - block_start, expected, address, "the long-term store")

        return await trio.to_thread.run_sync(fetch_and_verify, limiter=self._limiter)

    async def block_crc32c(self, chunk: Chunk) -> Sequence[int]:
        """The chunk's block CRC32Cs from its checked index object."""
        return (await self.index_of(chunk)).block_crc32c

    def read_blocks(self, chunk: Chunk, spans: Sequence[tuple[int, int]], on_block: BlockSink) -> None:
        """Blocking (a worker thread): adjacent block ``spans`` of the offloaded chunk,
        one ranged GET, each handed to ``on_block`` as it arrives (unchecked: the caller
        checks them against ``block_crc32c``)."""
        long_term = self.long_term
        long_term.storage.read_blocks(long_term.key_of(chunk.location), spans, on_block)

    async def index_of(self, chunk: Chunk, *, cached: bool = True) -> IndexObject:
        """The chunk's index object, fetched once and cached, checked against the
        record; ``cached=False`` (fsck) reads the object again."""
        long_term = self.long_term
        keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)

        async def fetch() -> bytes:
            return await trio.to_thread.run_sync(long_term.read_all, keys.index, limiter=self._limiter)

        if not cached:
            return decode_index(await fetch(), chunk, long_term.url_of(keys.index))
        index = self._indexes.get(keys.index)
        if index is None:  # the key names one attempt of one chunk: its checks hold for good
            raw = await self._index_cache.get(keys.index, fetch)
            index = decode_index(raw, chunk, long_term.url_of(keys.index))
            self._indexes[keys.index] = index
        return index
