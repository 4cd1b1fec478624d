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
read once and each stream sends from the feed's window. A stream behind the window (it
started far back, or its follower is slow) reads the store itself until it catches up.

Invariants:
- Only durable bytes are sent, and only bytes of the segment the stream opened (its
  ETag): a name that now holds another segment ends the stream before any of its bytes
  is sent.
- Memory per follower is bounded: a stream holds at most one piece
  (``STREAM_PIECE_BYTES``, or one shared piece of the feed) and awaits the connection's
  send before taking another, so a slow or stalled follower costs one piece and its
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
from starlette.responses import Response, StreamingResponse

from tierfs.contracts.api import SegmentReaderAPI
from tierfs.contracts.errors import (
    SegmentNotFoundError,
    StoreClosedError,
    TierFSError,
    TruncatedError,
)
from tierfs.contracts.info import SegmentInfo
from tierfs.server.follow_feed import FEED_TICK_S, SegmentFeed
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

    def respond(self, request: Request, name: str, info: SegmentInfo) -> Response:
        """The stream of segment ``name`` (``info``: its stat, already matched against
        If-Match by the caller)."""
        offset = query_int(request, "offset", 0) or 0
        idle_s = query_seconds(request, "timeout", STREAM_DEFAULT_IDLE_S, STREAM_MAX_IDLE_S)
        if offset < info.start_offset:  # said now, as a status: once streaming, it could only cut
            raise TruncatedError(name, offset, info.start_offset)
        feed = self._feed(name, info)
        headers = {"ETag": f'"{info.segment_id}"', "X-Tierfs-Offset": str(offset),
                   "X-Tierfs-Durable-Length": str(info.durable_length), "Cache-Control": "no-store"}
        return StreamingResponse(self._pieces(name, feed, offset, idle_s), headers=headers,
                                 media_type="application/octet-stream")

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

    async def _pieces(self, name: str, feed: SegmentFeed, offset: int, idle_s: float) -> AsyncIterator[bytes]:
        feed.joined()
        reader: SegmentReaderAPI | None = None
        quiet_ticks = 0  # the feed's ticks (FEED_TICK_S without growth) since this stream's last byte
        try:
            while True:
                if offset < feed.window_start:  # behind the feed: read the store at its own pace
                    reader = reader or self._store.open_reader(name)
                    data = await reader.read(offset, min(STREAM_PIECE_BYTES, feed.window_start - offset))
                    now = await self._store.stat(name)  # the bytes must be the opened segment's
                    if not data or not isinstance(now, SegmentInfo) or now.segment_id != feed.segment_id:
                        return
                elif offset < feed.end:
                    data = feed.piece_from(offset, STREAM_PIECE_BYTES)
                elif feed.failure is not None:
                    raise TierFSError(f"following {name!r} failed: {feed.failure}")
                elif feed.closed or quiet_ticks * FEED_TICK_S >= idle_s:
                    return  # deleted, replaced, stopping, or idle: the client reopens
                else:
                    ticks = feed.ticks
                    await feed.changed.wait()
                    quiet_ticks += feed.ticks - ticks
                    continue
                yield data
                offset += len(data)
                quiet_ticks = 0
        except SegmentNotFoundError:
            return
        finally:
            feed.left()
