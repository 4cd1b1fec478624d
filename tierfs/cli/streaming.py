"""The CLI's append streams, with bounded memory: ``tierfs append`` of DATA, a file or
stdin (``tierfs tail``'s follow lives in ``tail`` and ``tail_source``).

- ``--file``: one atomic record. Its size is checked against the store's
  ``max_append_bytes`` (the daemon's, asked over ``/v1/health``) before a byte is read,
  so a file too large is refused at once; through a daemon it is streamed in pieces as
  the request body, so the command never holds the file (in-process the engine takes
  the record whole, at most ``max_append_bytes``).
- stdin (DATA ``-`` or none): read in pieces of at most ``STDIN_PIECE_BYTES`` (and at
  most ``max_append_bytes``), each one record; the first carries ``--expected-offset``.
  Empty stdin is one empty append, so the condition is still checked.
- Through a daemon every append lands exactly once, even if an answer is lost and it is
  retried (``RemoteStore.append``, ``remote.exactly_once``): the command is one writer
  (``contracts.writers``), each record one of its sequence numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import trio

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import AppendTooLargeError
from tierfs.contracts.writers import Writer

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

STDIN_PIECE_BYTES = 16 << 20  # stdin is appended in records of at most this size


@runtime_checkable
class DaemonBacked(Protocol):
    """A store served by a daemon (``RemoteStore``): its client streams a file."""

    client: TierClient


class ConfiguredStore(Protocol):
    config: StoreConfig


async def max_append_bytes(store: SegmentStoreAPI) -> int:
    """The largest single append the store takes (the daemon's, when one serves)."""
    if isinstance(store, DaemonBacked):
        health = await trio.to_thread.run_sync(store.client.health)
        return int(health["max_append_bytes"])
    configured: ConfiguredStore = store  # type: ignore[assignment]  # the in-process store
    return configured.config.max_append_bytes


async def append_file(store: SegmentStoreAPI, name: str, path: str, expected_offset: int | None) -> int:
    """Append the file at ``path`` as one record; refused before reading when too large."""
    length = os.stat(path).st_size
    limit = await max_append_bytes(store)
    if length > limit:
        raise AppendTooLargeError(length, limit)
    if isinstance(store, DaemonBacked):
        from tierfs.remote.exactly_once import FilePayload, append_exactly_once

        client, payload = store.client, FilePayload(path, length)
        return await trio.to_thread.run_sync(lambda: append_exactly_once(
            client, name, payload, expected_offset, conditional=expected_offset is not None))
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew meanwhile
        raise AppendTooLargeError(len(data), limit)
    return await store.append(name, data, expected_offset=expected_offset)


async def append_stdin(store: SegmentStoreAPI, name: str, expected_offset: int | None) -> int:
    """Append stdin in records; the offset of the first."""
    piece_bytes = min(STDIN_PIECE_BYTES, await max_append_bytes(store))
    writer = Writer()  # the command's records are one writer's, in order
    piece = sys.stdin.buffer.read(piece_bytes)
    first = await store.append(name, piece, expected_offset=expected_offset, writer=writer.next())
    while len(piece) == piece_bytes:  # a short read was the end (a terminal's Ctrl-D is read once)
        piece = sys.stdin.buffer.read(piece_bytes)
        if piece:
            await store.append(name, piece, writer=writer.next())
    return first


async def append_command(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    """``tierfs append PATH [DATA | - | --file FILE] [--expected-offset N]``."""
    if args.file is not None:
        offset = await append_file(store, args.path, args.file, args.expected_offset)
    elif args.data is None or args.data == "-":
        if sys.stdin.isatty():  # not piped: say what it waits for
            print("tierfs: appending what you type as one record: end it with Ctrl-D "
                  "(or give DATA, - for a pipe, or --file FILE)", file=sys.stderr, flush=True)
        offset = await append_stdin(store, args.path, args.expected_offset)
    else:
        offset = await store.append(args.path, args.data.encode(), expected_offset=args.expected_offset)
    print(offset)
    return 0
