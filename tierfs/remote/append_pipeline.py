"""Pipelined appends: one writer's appends to one segment, sent back to back on one
connection of the daemon's append socket, so the next body travels while the previous
append is being made durable (the fsspec plugin's files, ``pipe_file``, ``cp_file``).

Invariants:
- Every append is one request carrying ``expected_offset``: the first at the segment's
  end as the writer knows it (a stat when it does not), each next one at the end of the
  one before. The daemon executes a connection's requests in order, each once the one
  before returned, and none after one that failed. So the appends land whole, in the
  order they were submitted, never interleaved with another writer's append.
- Unconditional writers (``conditional=False``, fsspec's ``ab``/``wb`` files): an append
  refused because another writer took its offset (``BadOffsetError``) is sent again at
  the segment's new end, and so is every one sent after it (none of them ran).
  Conditional writers (``pipe_file``, ``cp_file``) get the ``BadOffsetError``.
- Exactly once: every append carries this pipeline's writer id and its own sequence
  number. When the connection breaks with answers unread, those appends may or may not
  have landed (up to the first that failed). They are resolved one by one, in order, by
  ``exactly_once.append_exactly_once`` with the same identity (the daemon answers one
  it holds with its offset, and appends one it does not); an append that did not land
  at its offset means none after it did, and they go to the new end. Then pipelining
  goes on.
- Bounded: at most ``depth`` appends are in flight (sent, answer unread) and each
  payload is held until its answer came; the caller's next payload waits meanwhile.
- Errors are the daemon's, raised by the ``submit`` or ``wait`` that reads them (one
  append after the one that failed, or at the latest by ``wait``). The appends that did
  not land stay queued in order and are sent again by the next ``submit`` or ``wait``
  (as fsspec sends a buffer again after a flush failed); after a ``ResponseLostError``
  whose retries ran out, with ``maybe_landed``.
- Without an append socket (a daemon over TCP, or one without it) every append goes
  through the API with ``append_exactly_once``, one after the other, as before.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from tierfs.contracts.errors import BadOffsetError, ResponseLostError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.contracts.writers import Writer, WriterSeq
from tierfs.remote.append_connection import AnswerLost, AppendConnection
from tierfs.remote.client import TierClient
from tierfs.remote.exactly_once import RETRY_BUDGET_S, BytesPayload, append_exactly_once

# Appends sent and not yet answered: one being made durable while the next one's body
# is received. A deeper pipeline would only hold more buffers: the daemon executes a
# connection's appends one after the other.
PIPELINE_DEPTH = 2

Payload = bytes | bytearray | memoryview


@dataclass
class _Append:
    data: Payload
    length: int
    writer: WriterSeq  # its identity, the same on every attempt
    offset: int | None = None  # where it is (to be) sent; None: at the end of the one before
    maybe_landed: bool = False  # sent on a connection that broke before its answer


class AppendPipeline:
    """Appends of one writer to ``name``, in order, each exactly once (see the module
    docstring); ``end``: where the next one goes (None until known)."""

    def __init__(self, client: TierClient, name: str, *, end: int | None = None, conditional: bool = False,
                 depth: int = PIPELINE_DEPTH, budget_s: float = RETRY_BUDGET_S) -> None:
        if conditional and end is None:
            raise ValueError("a conditional pipeline starts at a known offset")
        self._client = client
        self._name = name
        self._target = f"/v1/segments/{TierClient._path(name)}"
        self._conditional = conditional
        self._depth = depth
        self._budget_s = budget_s  # how long an append whose answer was lost is retried
        self.end = end
        self._queued: deque[_Append] = deque()  # to send, in order (after a failure: again)
        self._in_flight: deque[_Append] = deque()  # sent on the connection, answers unread
        self._connection: AppendConnection | None = None
        self._writer = Writer()  # this pipeline's appends are one writer's, in order

    def submit(self, data: Payload) -> None:
        """Send ``data`` as one append, after every one submitted before; returns
        without waiting for its answer."""
        self._queued.append(_Append(data, memoryview(data).nbytes, self._writer.next()))
        self._advance(drain=False)

    def wait(self) -> int | None:
        """Wait until every submitted append landed; the end after the last one."""
        self._advance(drain=True)
        return self.end

    @property
    def busy(self) -> bool:
        """Appends submitted and not known to have landed."""
        return bool(self._queued or self._in_flight)

    def close(self) -> None:
        """Let the connection go (appends in flight are not waited for)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ------------------------------------------------------------------ the loop
    def _advance(self, *, drain: bool) -> None:
        while self._queued or (drain and self._in_flight):
            if self._in_flight and (len(self._in_flight) >= self._depth or not self._queued):
                self._read_answer()
            elif self._queued[0].maybe_landed:
                self._resolve_first()  # nothing is in flight: a broken connection's appends come first
            else:
                connection = self._connect()
                if connection is None:
                    self._resolve_first()  # no append socket: through the API
                else:
                    self._send_first(connection)

    def _connect(self) -> AppendConnection | None:
        connection = self._connection
        if connection is not None and (self._in_flight or connection.reusable()):
            return connection
        self.close()
        path = self._client.append_socket()
        if path is not None:
            self._connection = self._client.connect_appends(path)
        return self._connection

    def _send_first(self, connection: AppendConnection) -> None:
        item = self._queued[0]
        if item.offset is None:
            item.offset = self._known_end()
        try:
            connection.send(f"{self._target}?expected_offset={item.offset}&writer={item.writer.writer_hex}"
                            f"&writer_seq={item.writer.seq}", item.data)
        except AnswerLost:
            item.offset = None  # not sent whole, so never executed: it follows the others
            self._connection_lost()
            return
        self._queued.popleft()
        self._in_flight.append(item)
        self.end = item.offset + item.length

    def _known_end(self) -> int:
        if self.end is None:
            info = self._client.stat(self._name)
            self.end = info.appended_length if isinstance(info, SegmentInfo) else 0
        return self.end

    def _read_answer(self) -> None:
        connection = self._connection
        assert connection is not None
        try:
            status, body = connection.answer()
        except AnswerLost:
            self._connection_lost()
            return
        item = self._in_flight.popleft()
        if status < 300:
            landed = int(json.loads(body)["offset"])
            if landed != item.offset:  # the daemon honours expected_offset: this cannot be
                raise AssertionError(f"an append sent at {item.offset} landed at {landed}")
            return
        # an error answer: the daemon ran none of the appends sent after this one
        error = self._client.answer_error(status, body)
        later = list(self._in_flight)
        self._in_flight.clear()
        self.close()
        assert item.offset is not None
        self.end = item.offset
        for unsent in (item, *later):
            unsent.offset = None
        self._queued.extendleft(reversed((item, *later)))
        if isinstance(error, BadOffsetError) and not self._conditional:
            self.end = error.actual  # another writer took the offset: from the new end
            return
        raise error

    def _connection_lost(self) -> None:
        """The connection broke: the appends in flight may have landed (each at its
        offset, up to the first that did not); they are resolved first."""
        lost = list(self._in_flight)
        self._in_flight.clear()
        self.close()
        for item in lost:
            item.maybe_landed = True
        self._queued.extendleft(reversed(lost))

    def _resolve_first(self) -> None:
        """The first queued append through ``append_exactly_once`` (the API)."""
        item = self._queued[0]
        expected = item.offset if item.offset is not None else self.end
        try:
            offset = append_exactly_once(
                self._client, self._name, BytesPayload(bytes(item.data)), expected,
                conditional=self._conditional, writer=item.writer, maybe_landed=item.maybe_landed,
                budget_s=self._budget_s,
            )
        except ResponseLostError as lost:  # retried for its whole budget: maybe landed there
            item.offset, item.maybe_landed = lost.offset, True
            raise
        self._queued.popleft()
        if offset != item.offset:  # it was not where the broken connection sent it:
            for later in self._queued:  # nothing sent after it on that connection ran
                later.offset, later.maybe_landed = None, False
        self.end = offset + item.length
