"""``SegmentFeed``: the recent growth of one followed segment, read from the store once
for all the streams following it, and written by the feed itself to the followers
that keep up.

A thousand followers of one segment must not make a thousand reads (and stats, and, in
a cluster, a thousand forwarded long polls) for every append: one task per followed
segment (``run``) waits for growth, reads the new durable bytes once, checks that the
name still holds the segment the streams opened, and publishes them. A stream sends
from the feed's window what it has not sent yet; a stream on a raw socket that has
caught up parks (``park``): the feed then writes each new piece to its socket itself,
in the same step for all of them, so a follower that keeps up costs one ``write`` per
piece and no task switch. A parked stream gets its task back as soon as the feed
cannot write all of a piece (the socket is full), on every tick, and when the feed
closes.

Invariants:
- The window holds only durable bytes of one segment (its id), contiguous, ending at
  ``end``; it keeps at most ``WINDOW_BYTES`` and ``WINDOW_PIECES`` pieces, so a feed's
  memory is bounded whatever the number of followers. A follower behind the window
  reads the store itself, at its own pace (``follow_stream``).
- Pieces are shared, never copied per follower: a follower at the start of the newest
  piece gets that very object, followers at the same offset share one join, and parked
  followers of one framing share one framed copy.
- A parked follower is written to only at its own offset, whole pieces in order; what
  the socket did not take is handed back (``Parked.pending``) with the stream's task,
  never dropped or written twice; a socket that fails is handed back broken.
- Once closed (segment deleted, name replaced, no stream for ``LINGER_S``, daemon
  stopping) a feed publishes nothing more; streams end when they have sent what it
  held. A read that fails closes it with ``failure`` set: its streams are cut short
  (an error), not ended as if the segment were merely quiet.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable

import trio

from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.store.served import ServedStore

log = logging.getLogger(__name__)

WINDOW_BYTES = 1 << 20  # recent growth kept per followed segment (not per follower)
WINDOW_PIECES = 512  # and at most this many appends' worth: trimming stays cheap
FEED_READ_BYTES = 256 << 10  # one read of new growth; more is read at once after it
FEED_TICK_S = 1.0  # with no growth, streams are woken this often to check their idle time
LINGER_S = 2.0  # a feed no stream follows stops after this (a follower reopening finds it)

Framing = Callable[[bytes], bytes]  # a piece as a parked follower's socket carries it


class Parked:
    """A caught-up stream whose socket the feed writes to itself."""

    __slots__ = ("fd", "offset", "frame", "pending", "broken", "resumed")

    def __init__(self, fd: int, offset: int, frame: Framing) -> None:
        self.fd = fd
        self.offset = offset  # the end of what was written (or handed back in pending)
        self.frame = frame
        self.pending = b""  # framed bytes the socket did not take: the stream's task writes them
        self.broken = False  # the socket failed: the stream ends
        self.resumed = trio.Event()


class SegmentFeed:
    def __init__(self, store: ServedStore, name: str, segment_id: int, durable_length: int) -> None:
        self._store = store
        self.name = name
        self.segment_id = segment_id
        self.end = durable_length  # every byte before it was published (or precedes the feed)
        self._starts: list[int] = []
        self._pieces: list[bytes] = []
        self._window_bytes = 0
        self._joined: tuple[int, int, bytes] = (-1, -1, b"")
        self._parked: dict[int, Parked] = {}  # by file descriptor
        self.changed = trio.Event()  # replaced by each publication, tick and closing
        self.grown_s = trio.current_time()  # when the last piece was published
        self.closed = False
        self.failure: str | None = None  # why reading the segment failed (its streams abort)
        self.streams = 0
        self._alone_since_s: float | None = trio.current_time()  # since when no stream follows it
        self._scope = trio.CancelScope()

    @property
    def window_start(self) -> int:
        return self._starts[0] if self._starts else self.end

    def piece_from(self, offset: int, limit_bytes: int) -> bytes:
        """Window bytes from ``offset`` (``window_start <= offset < end``), at most
        ``limit_bytes`` unless one shared piece is longer."""
        index = bisect.bisect_right(self._starts, offset) - 1
        if offset == self._starts[index] and index == len(self._starts) - 1:
            return self._pieces[index]  # the usual case: a follower that keeps up
        joined_offset, joined_end, joined = self._joined
        if joined_offset == offset and joined_end == self.end:
            return joined
        parts, size = [], 0
        head = self._pieces[index][offset - self._starts[index]:]
        for part in [head, *self._pieces[index + 1:]]:
            if size >= limit_bytes:
                break
            parts.append(part)
            size += len(part)
        data = b"".join(parts)
        if offset + len(data) == self.end:
            self._joined = (offset, self.end, data)
        return data

    async def park(self, fd: int, offset: int, frame: Framing) -> Parked:
        """Hand a caught-up stream's socket ``fd`` (non-blocking) to the feed, which
        writes each new piece to it, framed by ``frame``; returns once the stream's
        task must go on itself (see ``Parked``)."""
        parked = Parked(fd, offset, frame)
        if self.closed or offset != self.end:
            return parked
        self._parked[fd] = parked
        try:
            await parked.resumed.wait()
        finally:
            if self._parked.get(fd) is parked:  # cancelled (its client went away)
                del self._parked[fd]
        return parked

    def joined(self) -> None:
        """A stream follows this feed from now on."""
        self.streams += 1
        self._alone_since_s = None

    def left(self) -> None:
        self.streams -= 1
        if self.streams == 0:
            self._alone_since_s = trio.current_time()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._scope.cancel()
            self._wake()

    def _wake(self) -> None:
        """Streams look again: the waiting ones and the parked ones."""
        for parked in list(self._parked.values()):
            self._resume(parked)
        event, self.changed = self.changed, trio.Event()
        event.set()

    def _resume(self, parked: Parked) -> None:
        del self._parked[parked.fd]
        parked.resumed.set()

    def _publish(self, data: bytes) -> None:
        start = self.end
        self._starts.append(start)
        self._pieces.append(data)
        self._window_bytes += len(data)
        self.end += len(data)
        self.grown_s = trio.current_time()
        if self._window_bytes > WINDOW_BYTES or len(self._pieces) > WINDOW_PIECES:
            drop = max(1, len(self._pieces) // 2)  # halve at once: trimming costs O(1) per append
            self._window_bytes -= sum(len(piece) for piece in self._pieces[:drop])
            del self._starts[:drop], self._pieces[:drop]
        if self._parked:
            self._write_parked(start, data)
        event, self.changed = self.changed, trio.Event()
        event.set()

    def _write_parked(self, start: int, data: bytes) -> None:
        framed: dict[Framing, bytes] = {}
        for parked in list(self._parked.values()):
            if parked.offset != start:  # cannot happen: parked only when caught up
                self._resume(parked)
                continue
            out = framed.get(parked.frame)
            if out is None:
                out = framed[parked.frame] = parked.frame(data)
            try:
                written = os.write(parked.fd, out)
            except BlockingIOError:
                written = 0
            except OSError:
                parked.broken = True
                self._resume(parked)
                continue
            parked.offset = start + len(data)
            if written < len(out):  # the socket is full: its task waits for room
                parked.pending = out[written:]
                self._resume(parked)

    async def _still_the_segment(self) -> bool:
        now = await self._store.stat(self.name)
        return isinstance(now, SegmentInfo) and now.segment_id == self.segment_id

    async def run(self) -> None:
        """Read and publish the segment's growth until closed."""
        with self._scope:
            try:
                while not self.closed:
                    if self._alone_since_s is not None and trio.current_time() - self._alone_since_s > LINGER_S:
                        break
                    durable = await self._store.wait_for_data(self.name, self.end, FEED_TICK_S)
                    data = b""
                    if durable > self.end:
                        data = await self._store.read(self.name, self.end, min(durable - self.end, FEED_READ_BYTES))
                    if not await self._still_the_segment():
                        break  # the name holds another segment now: these bytes are not this one's
                    if data:
                        self._publish(data)
                    else:
                        self._wake()  # a tick: streams check how long they have been idle
            except SegmentNotFoundError:
                pass
            except Exception as e:
                log.exception("following %r failed; its streams end", self.name)
                self.failure = f"{type(e).__name__}: {e}"
        self.close()
