"""The one verified-block check: bytes + what the metadata expects -> the bytes, or the
corruption error. Every reader of stored bytes goes through it: the engine's tier-2
reads, long-term reads, offload copies and clients' direct chunk reads.

Invariant: a block is returned only if it has exactly the expected length and CRC32C;
otherwise ``DataCorruptionError`` names where the block came from, which block, and
which segment bytes it holds. Nothing is returned on a mismatch.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import DataCorruptionError


@dataclasses.dataclass(frozen=True)
class BlockAddress:
    """Where a block came from, for error messages: ``source`` names the object (a
    chunk name, an offloaded chunk's URL, a chunk URL), ``segment_start`` is the segment
    offset of the block's first byte (None where unknown)."""

    source: str
    block: int
    segment_start: int | None = None

    def describe(self, length: int) -> str:
        where = f"{self.source} block {self.block}"
        if self.segment_start is not None:
            where += f" (segment bytes {self.segment_start}..{self.segment_start + length})"
        return where


BlockData = TypeVar("BlockData", bytes, memoryview)


def verified_block(
    data: BlockData, expected_length: int, expected_crc32c: int, address: BlockAddress, origin: str = "storage"
) -> BlockData:
    """``data`` if it is ``expected_length`` bytes with CRC32C ``expected_crc32c``."""
    if len(data) != expected_length:
        raise DataCorruptionError(
            f"{address.source} block {address.block}: expected {expected_length} bytes, "
            f"{origin} returned {len(data)}"
        )
    if crc32c(data) != expected_crc32c:
        raise DataCorruptionError(
            f"{address.describe(expected_length)} failed its CRC32C check; refusing to return it"
        )
    return data
