"""Where ``tierfs tail`` gets a segment's bytes: the daemon serving the data dir
(``DaemonSource``) or the store opened in-process (``LocalSource``).

Both pin every read to a segment id: ``read`` and ``follow`` serve only bytes of the
segment ``tail`` opened, never those of another segment a rename or a re-create put
under the same name, and ``follow`` returns (rather than going on with the other
segment) once the name no longer holds it.

- Through a daemon a follow is one streamed response (``TierClient.follow``) that the
  daemon writes to as soon as an append is durable, read in a worker thread that writes
  each piece out itself (``deliver``), so a line reaches the screen without a hop
  through the event loop. The daemon ends the stream when the segment is deleted or
  its name moves (it checks on growth and at least once a second, ``follow_feed``);
  the stream is opened by name, so the first piece is only delivered once a stat shows
  the name still holds the segment (a rename in the moment between tail's stat and the
  stream's opening would otherwise pass another segment's bytes).
- In-process a follow waits on the segment's growth (``wait_for_data``), at most
  ``NAME_CHECK_S`` at a time, and stats the name at every wake-up.

Neither polls for growth: a follower sleeps until bytes become durable.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Protocol

import trio

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.contracts.reports.info import Info, SegmentInfo

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

FOLLOW_PIECE_BYTES = 4 << 20  # an in-process follow reads at most this much at once
NAME_CHECK_S = 1.0  # an in-process follow looks at its name at least this often (as the daemon does)

Deliver = Callable[[bytes], bool]  # write a piece out; False: stop (the output is closed)


class TailSource(Protocol):
    """The four calls ``tail`` makes; ``SegmentNotFoundError`` when a name holds
    nothing (or, for ``read``, no longer the segment ``segment_id``)."""

    async def stat(self, name: str) -> Info: ...

    async def list(self, directory: str) -> builtins.list[Info]: ...

    async def read(self, name: str, segment_id: int, offset: int, length: int) -> bytes: ...

    async def follow(self, name: str, segment_id: int, offset: int, deliver: Deliver) -> None:
        """Deliver the segment's durable bytes from ``offset`` on as they come, until
        ``name`` no longer holds segment ``segment_id`` or ``deliver`` says stop."""
        ...


class DaemonSource:
    def __init__(self, client: TierClient, followers: int) -> None:
        self._client = client
        # a thread per followed segment, apart from trio's default limiter (its 40
        # threads would hold back the 41st follow and every other call)
        self._follow_threads = trio.CapacityLimiter(max(1, followers))

    async def stat(self, name: str) -> Info:
        client = self._client
        return await trio.to_thread.run_sync(lambda: client.stat(name))

    async def list(self, directory: str) -> builtins.list[Info]:
        client = self._client
        return await trio.to_thread.run_sync(lambda: client.ls(directory))

    async def read(self, name: str, segment_id: int, offset: int, length: int) -> bytes:
        client = self._client
        return await trio.to_thread.run_sync(
            lambda: client.read(name, offset, offset + length, segment_id=segment_id))

    async def follow(self, name: str, segment_id: int, offset: int, deliver: Deliver) -> None:
        client = self._client

        def copy() -> None:
            pieces = client.follow(name, offset)
            try:
                checked = False
                for piece in pieces:
                    if not checked:  # the stream opened by name: is it still this segment's?
                        now = client.stat(name)
                        if not isinstance(now, SegmentInfo) or now.segment_id != segment_id:
                            return
                        checked = True
                    if not deliver(piece):
                        return
            except SegmentNotFoundError:  # deleted, or the name holds another segment
                return
            finally:
                if isinstance(pieces, Generator):  # closes the stream now, not when collected
                    pieces.close()

        # abandon_on_cancel: --pid and Ctrl-C end tail without waiting for the next byte
        await trio.to_thread.run_sync(copy, abandon_on_cancel=True, limiter=self._follow_threads)


class LocalSource:
    def __init__(self, store: SegmentStoreAPI) -> None:
        self._store = store

    async def stat(self, name: str) -> Info:
        return await self._store.stat(name)

    async def list(self, directory: str) -> builtins.list[Info]:
        return await self._store.list(directory)

    async def _check(self, name: str, segment_id: int) -> SegmentInfo:
        now = await self._store.stat(name)
        if not isinstance(now, SegmentInfo) or now.segment_id != segment_id:
            raise SegmentNotFoundError(name)
        return now

    async def read(self, name: str, segment_id: int, offset: int, length: int) -> bytes:
        await self._check(name, segment_id)
        return await self._store.read(name, offset, length)

    async def follow(self, name: str, segment_id: int, offset: int, deliver: Deliver) -> None:
        try:
            while True:
                await self._store.wait_for_data(name, offset, NAME_CHECK_S)
                length = (await self._check(name, segment_id)).length
                while offset < length:
                    data = await self._store.read(name, offset, min(length - offset, FOLLOW_PIECE_BYTES))
                    if not data:
                        break
                    if not deliver(data):
                        return
                    offset += len(data)
        except SegmentNotFoundError:
            return


def source_for(store: SegmentStoreAPI, followers: int) -> TailSource:
    """The daemon's client when a daemon serves the store, else the store itself."""
    from tierfs.cli.streaming import DaemonBacked

    if isinstance(store, DaemonBacked):
        return DaemonSource(store.client, followers)
    return LocalSource(store)
