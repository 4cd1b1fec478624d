"""Appends over the daemon that land exactly once, even when an answer is lost.

A request whose connection breaks after it was sent (``ResponseLostError``) may or may
not have been committed; resending it blindly could land the bytes twice. So every
append sent here is conditional on an offset (``expected_offset``: the daemon refuses
it with ``BadOffsetError`` anywhere else), and after a lost answer:

1. wait ``RETRY_PAUSE_S`` and send the same append at the same offset again;
2. if it is refused because the segment already extends past that offset, read the
   bytes at the offset back: when they equal the payload, the lost attempt landed, and
   the append succeeded there (once); otherwise another writer took the offset, so the
   lost attempt can never land (it was conditional on that offset).

Invariants:
- A payload is written at most once, at one offset: no attempt is ever unconditional.
- A caller's ``expected_offset`` is kept (``conditional``): a writer that finds the
  offset taken by someone else gets ``BadOffsetError``. Without one, the segment's end
  is learnt with a stat, and a concurrent writer's append moves the attempt to the new
  end (it was refused, so nothing was written).
- Only lost answers are retried, for at most ``RETRY_BUDGET_S``; a daemon that cannot
  be reached before anything was sent is ``DaemonUnavailableError`` at once.
- Memory stays bounded: payloads stream and are compared in ``COMPARE_PIECE_BYTES``.

Known limit: a concurrent writer that appends byte-identical data at exactly the
offset of a lost attempt is taken for that attempt.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Protocol

from tierfs.contracts.errors import BadOffsetError, DaemonUnavailableError, ResponseLostError
from tierfs.contracts.info import SegmentInfo
from tierfs.remote.client import TierClient

RETRY_BUDGET_S = 15.0  # long enough for a daemon restart after a crash
RETRY_PAUSE_S = 0.2
COMPARE_PIECE_BYTES = 4 << 20  # read back and compare this much at a time
FILE_PIECE_BYTES = 1 << 20  # a file payload is streamed in pieces of this size


class Payload(Protocol):
    """The bytes of one append; ``pieces`` can be iterated again for a retry."""

    length: int

    def pieces(self) -> Iterator[bytes]: ...


class BytesPayload:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def pieces(self) -> Iterator[bytes]:
        yield self.data


class FilePayload:
    """The first ``length`` bytes of a file, read in pieces (never held whole)."""

    def __init__(self, path: str | os.PathLike[str], length: int) -> None:
        self.path = path
        self.length = length

    def pieces(self) -> Iterator[bytes]:
        remaining = self.length
        with open(self.path, "rb") as f:
            while remaining > 0:
                piece = f.read(min(FILE_PIECE_BYTES, remaining))
                if not piece:
                    raise OSError(f"{self.path} shrank while being appended")
                remaining -= len(piece)
                yield piece


def _send(client: TierClient, name: str, payload: Payload, offset: int) -> int:
    if isinstance(payload, BytesPayload):
        return client.append(name, payload.data, offset)
    return client.append(name, payload.pieces(), offset, length=payload.length)


def landed_at(client: TierClient, name: str, payload: Payload, offset: int) -> bool:
    """True when the segment holds exactly ``payload`` at ``offset`` (appended bytes)."""
    info = client.stat(name)
    if not isinstance(info, SegmentInfo) or info.appended_length < offset + payload.length:
        return False
    position = offset
    for piece in payload.pieces():
        view = memoryview(piece)
        for start in range(0, len(view), COMPARE_PIECE_BYTES):
            part = view[start:start + COMPARE_PIECE_BYTES]
            if client.read(name, position, position + len(part), unconfirmed=True) != part:
                return False
            position += len(part)
    return True


def append_exactly_once(
    client: TierClient,
    name: str,
    payload: Payload,
    expected_offset: int | None = None,
    *,
    conditional: bool,
    maybe_landed: bool = False,
    budget_s: float = RETRY_BUDGET_S,
) -> int:
    """Append ``payload`` once; its offset. ``conditional``: only at ``expected_offset``
    (which must then be given); otherwise at the end, starting from ``expected_offset``
    as a hint when given (a stat when not). ``maybe_landed``: an earlier call failed
    with ``ResponseLostError`` whose ``offset`` is ``expected_offset`` (a caller
    resending a buffer after giving up once, as fsspec's ``close`` does).

    When the budget runs out after a lost answer, ``ResponseLostError`` is raised with
    ``offset`` set to where the payload may have landed."""
    offset = expected_offset
    if offset is None:
        info = client.stat(name)
        offset = info.appended_length if isinstance(info, SegmentInfo) else 0
    deadline = time.monotonic() + budget_s
    unsure = maybe_landed  # an earlier attempt at ``offset`` may have landed
    while True:
        try:
            return _send(client, name, payload, offset)
        except BadOffsetError as refused:
            if unsure and landed_at(client, name, payload, offset):
                return offset
            if conditional:
                raise
            offset, unsure = refused.actual, False
        except DaemonUnavailableError as failed:
            unsure = unsure or isinstance(failed, ResponseLostError)
            if not unsure:
                raise
            if time.monotonic() > deadline:
                lost = ResponseLostError(f"{failed}; the append to {name!r} may have landed at {offset}")
                lost.offset = offset
                raise lost from None
            time.sleep(RETRY_PAUSE_S)
