"""Writes retried over a mount: a write the application sends again (after EINTR, a
timeout, a crashed writer that replays its last block) must not land twice.

A write at an offset below the segment's end is normally refused (EPERM: append-only).
When the bytes it carries are exactly the bytes already stored at that offset, it is the
same write again, and it succeeds without writing anything.

Invariants:
- Nothing is ever written here; the comparison reads the appended bytes (``unconfirmed``)
  of the range only.
- A write that differs in any byte, or that runs past the end, is still refused.
"""

from __future__ import annotations

from tierfs.contracts.errors import BadOffsetError
from tierfs.store.served import HeldFile


async def already_written(file: HeldFile, refused: BadOffsetError, data: bytes) -> bool:
    """True when the refused write at ``refused.expected`` carries bytes already stored there."""
    offset = refused.expected
    if offset + len(data) > refused.actual:
        return False
    return await file.read(offset, len(data), unconfirmed=True) == data
