"""The streaming follow: ``GET /v1/segments/{path}?follow=1&stream=1&offset=N&timeout=S``,
one long-lived response per follower that the daemon writes to as the segment grows
(``tail -f`` without a request per wake-up).

The body is the segment's durable bytes from ``offset`` on, in order, each byte once,
sent (chunked) as soon as it is durable. The response ends cleanly when no byte became
durable for ``timeout`` seconds, when the segment is deleted or its name moves to
another segment, and when the daemon stops; the client reopens it at the offset it
reached, and that request answers 404 ``not_found`` if the segment is gone. A read
that fails (corrupt data) cuts the response short instead: the client sees an error,
never a quiet end.

The streams of one segment share one ``SegmentFeed`` (``follow_feed``): its growth is
read once and each stream (a ``StreamCursor``) sends from the feed's window. A stream
behind the window (it started far back, or its follower is slow) reads the store
itself until it catches up. A server that owns its sockets (``stream_socket``) parks a
caught-up stream on the feed, which then writes the new pieces to that socket itself.

Invariants:
- Only durable bytes are sent, and only bytes of the segment the stream opened (its
  ETag): a name that now holds another segment ends the stream before any of its bytes
  is sent.
- Memory per follower is bounded: a stream holds at most one piece
  (``STREAM_PIECE_BYTES``, or one shared piece of the feed, or what a parked socket did
  not take of one) and awaits the connection's send before taking another, so a slow or stalled follower costs one piece and its
  socket buffer whatever the segment's growth; the feeds' windows are bounded per
  followed segment.
- Errors before the first byte are answered as for any read (404, 400 is_a_directory,
  If-Match, 410 ``truncated`` for an offset retention deleted, 503 ``closed`` while
  the daemon stops).
"""


from __future__ import annotations

from collections.abc import AsyncIterator

import trio
from starlette.requests import Request
from starlette.responses import StreamingResponse

from tierfs.contracts.api import SegmentReaderAPI
from tierfs.contracts.errors import (
    SegmentNotFoundError,
    StoreClosedError,
    TierFSError,
    TruncatedError,
)
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.server.follow_feed import Framing, SegmentFeed
from tierfs.server.query import query_int, query_seconds
from tierfs.store.served import ServedStore

# At most this much is read ahead of a follower's connection: a follower far behind
# catches up in pieces of this size, and a stalled one pins no more than this.
STREAM_PIECE_BYTES = 256 << 10
STREAM_MAX_IDLE_S = 300.0  # the longest a stream may stay open without a new byte
STREAM_DEFAULT_IDLE_S = 30.0  # the client reopens an idle stream: a liveness check both ways


class FollowStreams:
    """The streamed follows of one daemon and the feeds they share. ``run`` hosts the
    feeds' tasks (the daemon starts it); ``stop()`` ends every stream (shutdown), so
    stopping never waits for followers."""

    def __init__(self, store: ServedStore) -> None:
        self._store = store
        self._feeds: dict[tuple[str, int], SegmentFeed] = {}
        self._nursery: trio.Nursery | None = None
        self._stopping = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._stopping.wait()
            nursery.cancel_scope.cancel()
        self._nursery = None

    def stop(self) -> None:
        self._stopping.set()
        for feed in list(self._feeds.values()):
            feed.close()

    def respond(self, request: Request, name: str, info: SegmentInfo) -> FollowResponse:
        """The stream of segment ``name`` (``info``: its stat, already matched against
        If-Match by the caller)."""
        offset = query_int(request, "offset", 0) or 0
        idle_s = query_seconds(request, "timeout", STREAM_DEFAULT_IDLE_S, STREAM_MAX_IDLE_S)
        if offset < info.start_offset:  # said now, as a status: once streaming, it could only cut
            raise TruncatedError(name, offset, info.start_offset)
        cursor = StreamCursor(self._store, name, self._feed(name, info), offset, idle_s)
        headers = {"ETag": f'"{info.segment_id}"', "X-Tierfs-Offset": str(offset),
                   "X-Tierfs-Durable-Length": str(info.durable_length), "Cache-Control": "no-store"}
        return FollowResponse(cursor, headers)

    def _feed(self, name: str, info: SegmentInfo) -> SegmentFeed:
        """The open feed of this segment, or a new one started."""
        key = (name, info.segment_id)
        feed = self._feeds.get(key)
        if feed is not None and not feed.closed:
            return feed
        if self._nursery is None or self._stopping.is_set():
            raise StoreClosedError("the daemon is not serving streamed follows (stopping)")
        feed = SegmentFeed(self._store, name, info.segment_id, info.durable_length)
        self._feeds[key] = feed
        self._nursery.start_soon(self._run_feed, key, feed)
        return feed

    async def _run_feed(self, key: tuple[str, int], feed: SegmentFeed) -> None:
        try:
            await feed.run()
        finally:
            if self._feeds.get(key) is feed:
                del self._feeds[key]


class StreamCursor:
    """One follower's place in its segment: the pieces to send, in order, each once
    (``next_piece``), and, once caught up on a raw socket, parking on the feed."""

    def __init__(self, store: ServedStore, name: str, feed: SegmentFeed, offset: int, idle_s: float) -> None:
        self._store = store
        self._name = name
        self.feed = feed
        self.offset = offset
        self._idle_s = idle_s
        self._started_s = trio.current_time()
        self._reader: SegmentReaderAPI | None = None
        self._joined = False  # counted among the feed's streams from the first piece asked
        self._closed = False

    def close(self) -> None:
        if self._joined and not self._closed:
            self.feed.left()
        self._closed = True

    def _join(self) -> None:
        if not self._joined and not self._closed:
            self._joined = True
            self.feed.joined()

    @property
    def caught_up(self) -> bool:
        """Nothing to send until the segment grows (the feed is still open)."""
        feed = self.feed
        return self.offset == feed.end and not feed.closed and feed.failure is None

    async def next_piece(self) -> bytes | None:
        """The next bytes to send, once there are; None when the stream ends cleanly
        (deleted, replaced, stopping, idle)."""
        self._join()
        feed = self.feed
        try:
            while True:
                if self.offset < feed.window_start:  # behind the feed: read the store at its own pace
                    self._reader = self._reader or self._store.open_reader(self._name)
                    data = await self._reader.read(self.offset, min(STREAM_PIECE_BYTES, feed.window_start - self.offset))
                    now = await self._store.stat(self._name)  # the bytes must be the opened segment's
                    if not data or not isinstance(now, SegmentInfo) or now.segment_id != feed.segment_id:
                        return None
                elif self.offset < feed.end:
                    data = feed.piece_from(self.offset, STREAM_PIECE_BYTES)
                elif feed.failure is not None:
                    raise TierFSError(f"following {self._name!r} failed: {feed.failure}")
                elif feed.closed or trio.current_time() - max(feed.grown_s, self._started_s) >= self._idle_s:
                    return None  # the client reopens
                else:
                    await feed.changed.wait()
                    continue
                self.offset += len(data)
                return data
        except SegmentNotFoundError:
            return None

    async def park(self, fd: int, frame: Framing) -> bytes:
        """While caught up, let the feed write new pieces to ``fd`` itself (see
        ``SegmentFeed.park``); the framed bytes the socket did not take, for the
        caller to send. Raises ``BrokenPipeError`` when the socket failed."""
        self._join()
        parked = await self.feed.park(fd, self.offset, frame)
        self.offset = parked.offset
        if parked.broken:
            raise BrokenPipeError(f"the follower of {self._name!r} went away")
        return parked.pending


class FollowResponse(StreamingResponse):
    """A streamed follow through any ASGI server (its body: the cursor's pieces), with
    the cursor for a server that writes the socket itself (``stream_socket``)."""

    def __init__(self, cursor: StreamCursor, headers: dict[str, str]) -> None:
        super().__init__(_pieces(cursor), headers=headers, media_type="application/octet-stream")
        self.cursor = cursor


async def _pieces(cursor: StreamCursor) -> AsyncIterator[bytes]:
    try:
        while (piece := await cursor.next_piece()) is not None:
            yield piece
    finally:
        cursor.close()
