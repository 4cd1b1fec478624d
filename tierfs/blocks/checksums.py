"""CRC32C of chunk data, whole and per 1 MiB block.

Invariants:
- Blocks are aligned to the start of their chunk: block ``i`` covers chunk bytes
  ``[i * BLOCK_BYTES, (i + 1) * BLOCK_BYTES)``; the last block may be short.
- ``BlockCrcs.extend`` gives the same result as computing over the concatenation, so a
  chunk that grows by appends keeps exact CRCs without re-reading its bytes.
"""

from __future__ import annotations

import dataclasses

import crc32c as _crc32c

BLOCK_BYTES = 1 << 20  # 1 MiB: one ranged GET and one cache entry per block


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    result: int = _crc32c.crc32c(data, value=value)
    return result


@dataclasses.dataclass
class BlockCrcs:
    """Running CRCs of a chunk: whole-chunk CRC and one CRC per block."""

    length: int = 0
    whole: int = 0
    blocks: list[int] = dataclasses.field(default_factory=list)

    def extend(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        self.whole = crc32c(view, self.whole)
        position = 0
        while position < len(view):
            offset_in_block = self.length % BLOCK_BYTES
            take = min(BLOCK_BYTES - offset_in_block, len(view) - position)
            piece = view[position : position + take]
            if offset_in_block == 0:
                self.blocks.append(crc32c(piece))
            else:
                self.blocks[-1] = crc32c(piece, self.blocks[-1])
            self.length += take
            position += take


def block_crcs_of(data: bytes | memoryview) -> BlockCrcs:
    crcs = BlockCrcs()
    crcs.extend(data)
    return crcs
