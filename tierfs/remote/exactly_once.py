"""Appends over the daemon that land exactly once, even when an answer is lost.

A request whose connection breaks after it was sent (``ResponseLostError``) may or may
not have been committed; resending it blindly could land the bytes twice. So every
append sent here carries a writer identity (``contracts.writers.WriterSeq``: the
caller's, else a fresh one), and after a lost answer the same append is sent again with
the same identity: the daemon that holds it answers with the offset it landed at
(``engine.writer_marks``), one that does not appends it. Bytes are never compared: two
writers appending identical bytes are two appends.

An append with an offset (``expected_offset``, or a hint where the caller knows where
its append should go) is conditional on it: the daemon refuses it with
``BadOffsetError`` anywhere else, so an unconditional writer's hinted append moves to the
segment's new end when another writer's append took its offset (nothing was written).
An append with neither is sent unconditionally: the owner assigns its offset in the
same round trip (no stat first, no retry loop between concurrent writers), and after a
lost answer the identity alone finds it.

Invariants:
- A payload is written at most once: its identity names it on every attempt.
- A caller's ``expected_offset`` is kept (``conditional``): a writer that finds the
  offset taken by someone else gets ``BadOffsetError``.
- Only lost answers are retried, for at most ``RETRY_BUDGET_S``; a daemon that cannot
  be reached before anything was sent is ``DaemonUnavailableError`` at once.
- An ``AlreadyAppendedError`` answer (the daemon holds a newer append of the same
  writer, so this one landed before it) counts as landed at the attempt's offset: a
  writer's appends are sent in order, each at the end of the one before. An attempt
  without an offset raises it: where the append landed is the caller's to know.
- Memory stays bounded: file payloads stream in ``FILE_PIECE_BYTES``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Protocol

from tierfs.contracts.errors import (
    AlreadyAppendedError,
    BadOffsetError,
    DaemonUnavailableError,
    ResponseLostError,
)
from tierfs.contracts.writers import Writer, WriterSeq
from tierfs.remote.client import TierClient

RETRY_BUDGET_S = 15.0  # long enough for a daemon restart after a crash
RETRY_PAUSE_S = 0.2
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


def _send(client: TierClient, name: str, payload: Payload, offset: int | None, writer: WriterSeq) -> int:
    if isinstance(payload, BytesPayload):
        return client.append(name, payload.data, offset, writer=writer)
    return client.append(name, payload.pieces(), offset, length=payload.length, writer=writer)


def append_exactly_once(
    client: TierClient,
    name: str,
    payload: Payload,
    expected_offset: int | None = None,
    *,
    conditional: bool,
    writer: WriterSeq | None = None,
    maybe_landed: bool = False,
    budget_s: float = RETRY_BUDGET_S,
) -> int:
    """Append ``payload`` once; its offset. ``conditional``: only at ``expected_offset``
    (which must then be given); otherwise at the end, starting from ``expected_offset``
    as a hint when given (where the owner puts it when not). ``writer``: the append's
    identity (a caller resending an append after giving up once passes the same one,
    with ``maybe_landed``); a fresh one when None.

    When the budget runs out after a lost answer, ``ResponseLostError`` is raised with
    ``offset`` set to where the payload may have landed."""
    identity = writer if writer is not None else Writer().next()
    if conditional and expected_offset is None:
        raise ValueError("a conditional append needs its expected_offset")
    offset = expected_offset
    deadline = time.monotonic() + budget_s
    unsure = maybe_landed  # an earlier attempt may have landed: the daemon may be restarting
    while True:
        try:
            return _send(client, name, payload, offset, identity)
        except AlreadyAppendedError:
            if offset is None:
                raise
            return offset
        except BadOffsetError as refused:
            if conditional:
                raise
            offset = refused.actual
        except DaemonUnavailableError as failed:
            unsure = unsure or isinstance(failed, ResponseLostError)
            if not unsure:
                raise
            if time.monotonic() > deadline:
                where = "" if offset is None else f" at {offset}"
                lost = ResponseLostError(f"{failed}; the append to {name!r} may have landed{where}")
                lost.offset = offset
                raise lost from None
            time.sleep(RETRY_PAUSE_S)
