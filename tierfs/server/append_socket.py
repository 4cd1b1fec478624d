"""The append socket, ``<data_dir>/tierfs-append.sock``: a lean HTTP/1.1 server of
appends (``POST /v1/segments/{path}?expected_offset=N&writer=W&writer_seq=S``, a
``Content-Length`` body), for
writers that send large appends back to back (the fsspec plugin's files).

Why: through hypercorn and Starlette an 8 MiB body arrives in 64 KiB pieces, each
passed through h11, an ASGI receive queue and Starlette's stream, then joined; the
writer waits for the answer before sending the next body, so the disk idles while the
body travels and the socket idles while the disk writes (84-300 MB/s for 8 MiB
appends where the engine in-process writes 360-530). Here the head is parsed by h11
and the body received with ``recv_into`` straight into one buffer of the connection,
and the next request's body is received while the previous append is being made
durable (pipelining); see "fsspec writes" in docs/PERFORMANCE.md.

Invariants:
- A connection's requests are executed strictly in the order they were sent, each as
  one ``store.append`` of its whole body (one atomic record, never interleaved with
  another append); a request's append starts only once the previous one returned
  (acknowledged at its segment's durability level), so a writer's appends land in the
  order it sent them.
- An error answer ends the connection: no request sent after a failed one is ever
  executed, so a pipelining client knows those did not land. A connection cut before
  its answers were read may have executed requests up to the first that failed.
- The answers are the API's: ``{"offset", "length"}``, or the same JSON errors and
  statuses (``statuses.error_response``); a body above ``max_append_bytes`` is 413
  ``too_large`` from its ``Content-Length``, before a byte of it is read.
- Memory is bounded per connection: one body being appended and one received body
  waiting for it, each at most ``max_append_bytes``; a connection idle for
  ``BUFFER_IDLE_S`` gives its receive buffer back.
- A request head must arrive within ``REQUEST_TIMEOUT_S`` once it started, and a body
  that stops moving for ``BODY_STALL_S`` ends the connection; an idle connection is
  kept (a writer's file may stay open for long).
- Owner-only like the API socket (0600 inside the 0700 data dir). A cluster daemon also
  serves it on TCP (``serve_append_listener``: other daemons forward appends there, over
  TLS when the daemon has a certificate), where every request must carry credentials
  ``server/credentials`` allows: a registered peer's (401 otherwise, nothing appended). A
  request marked forwarded for a container (``FORWARDED_HEADER``) is served by that
  container's store or refused ``not_owner``, as on the API. When the daemon stops,
  accepting stops and open connections get ``listeners.STOP_GRACE_S`` to end (an
  append cut short is resolved by the client's exactly-once resend).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import h11
import trio

from tierfs.cluster.forwarding import forwarded_request
from tierfs.contracts.error_wire import error_details
from tierfs.contracts.errors import AppendTooLargeError, InvalidArgumentError, TierFSError
from tierfs.contracts.operations import FORWARDED_HEADER
from tierfs.contracts.writers import WriterSeq
from tierfs.server.credentials import TcpCredentials
from tierfs.server.listeners import TlsSocket, serve_listening_socket, serve_unix_socket
from tierfs.server.statuses import STATUS_BY_CODE, error_response
from tierfs.store.served import ServedStore

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0  # a request head must arrive whole within this once started
BODY_STALL_S = 60.0  # a body that moves no byte for this long ends the connection
BUFFER_IDLE_S = 1.0  # an idle connection frees its receive buffer after this
REQUEST_HEAD_MAX_BYTES = 16 << 10
HEAD_RECV_BYTES = 16 << 10  # a head is read in pieces of this size (a body's first bytes may come along)
SEGMENTS_PATH = "/v1/segments/"
Connection = trio.socket.SocketType | TlsSocket  # a plain connection, or one over TLS


async def serve_append_socket(
    store: ServedStore, path: Path, backlog: int, stop: trio.Event,
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve appends on the Unix socket ``path`` until ``stop`` is set."""

    async def handle(stream: trio.SocketStream) -> None:
        await AppendConnection(store, stream.socket).serve()

    await serve_unix_socket(path, backlog, stop, handle, task_status=task_status)


async def serve_append_listener(
    store: ServedStore, sock: trio.socket.SocketType, stop: trio.Event, credentials: TcpCredentials,
    tls: ssl.SSLContext | None, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve appends on the TCP socket ``sock`` (bound and listening; over TLS with
    ``tls``) until ``stop`` is set; every request must carry credentials that
    ``credentials`` allows."""

    async def handle(stream: trio.SocketStream) -> None:
        connection = stream.socket if tls is None else TlsSocket(stream.socket, tls)
        await AppendConnection(store, connection, credentials).serve()

    await serve_listening_socket(sock, stop, handle, task_status=task_status)


class ConnectionEnds(Exception):
    """The connection cannot go on (the client went away, stalled or broke the protocol)."""


@dataclass
class AppendRequest:
    name: str
    expected_offset: int | None
    length: int
    keep_alive: bool
    expect_continue: bool
    writer: WriterSeq | None = None
    forwarded: int | None = None  # the container another daemon forwarded it for


class Refusal(Exception):
    """A request refused before its body was read: answered, then the connection ends."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.details = status, code, details


class AppendConnection:
    """One client connection: requests read in order, each appended once the previous
    append returned, answers sent in the same order."""

    def __init__(self, store: ServedStore, sock: Connection, credentials: TcpCredentials | None = None) -> None:
        self._store = store
        self._sock = sock
        self._credentials = credentials  # who may send requests (TCP), None: not asked (the Unix socket)
        self._pending = bytearray()  # bytes received past the last request's end
        self._buffer = bytearray()  # the body receive buffer, reused across requests
        self._previous: _Append | None = None

    async def serve(self) -> None:
        try:
            async with trio.open_nursery() as appends:  # appends under way finish, whatever the reading did
                try:
                    await self._read_requests(appends)
                except ConnectionEnds:
                    pass
        except Exception:
            log.exception("the append socket's connection failed")
        finally:
            self._sock.close()

    async def _read_requests(self, appends: trio.Nursery) -> None:
        while True:
            try:
                request = await self._next_request()
            except Refusal as refusal:
                if await self._after_previous():  # answers go out in order
                    await self._send(_error_answer(refusal.code, str(refusal), refusal.details, status=refusal.status))
                await self._discard_input()
                return
            if request is None:
                return  # the client closed: appends under way finish (the nursery waits)
            if request.expect_continue:  # curl's, for large bodies: interim answers go out in order too
                if not await self._after_previous():
                    await self._discard_input()
                    return
                await self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await self._receive_body(request.length)
            if not await self._after_previous():
                await self._discard_input()
                return  # the previous append failed: nothing after it is executed
            append = _Append(self._store, self._sock, request, body)
            self._previous = append
            appends.start_soon(append.run)
            if not request.keep_alive:
                return
            del body  # the append holds it until the engine has it, not this loop while it waits

    async def _discard_input(self) -> None:
        """After an error answer: no more answers; what the client still sends is read
        and dropped until it closes (closing with unread input would reset the
        connection, and the client could lose the error answer it has not read yet)."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
            scratch = bytearray(HEAD_RECV_BYTES)
            with trio.move_on_after(BODY_STALL_S):
                while await self._sock.recv_into(scratch):
                    pass
        except OSError:
            pass

    async def _after_previous(self) -> bool:
        """Wait for the previous append to be done; False if it failed (its answer
        ended the connection)."""
        previous = self._previous
        if previous is None:
            return True
        await previous.done.wait()
        return previous.succeeded

    async def _next_request(self) -> AppendRequest | None:
        """The next request's head, checked; None when the client closed between requests."""
        head_end = self._pending.find(b"\r\n\r\n")
        if head_end < 0 and not self._pending:
            with trio.move_on_after(BUFFER_IDLE_S) as idle:
                if not await self._receive_head_piece():
                    return None
            if idle.cancelled_caught:
                self._buffer = bytearray()  # idle: give the body buffer back
                if not await self._receive_head_piece():
                    return None
            head_end = self._pending.find(b"\r\n\r\n")
        with trio.move_on_after(REQUEST_TIMEOUT_S) as late:
            while head_end < 0:
                if len(self._pending) > REQUEST_HEAD_MAX_BYTES:
                    raise Refusal(431, "invalid_argument", "the request head is too large")
                if not await self._receive_head_piece():
                    if self._pending:
                        raise ConnectionEnds("the client closed in the middle of a request head")
                    return None
                head_end = self._pending.find(b"\r\n\r\n")
        if late.cancelled_caught:
            raise ConnectionEnds("a request head did not arrive in time")
        head = bytes(self._pending[:head_end + 4])
        del self._pending[:head_end + 4]
        event, headers = _request_head(head)
        if self._credentials is not None:
            try:
                await self._credentials.check(headers)
            except TierFSError as e:  # unauthorized, or the peer registry cannot be read
                raise Refusal(STATUS_BY_CODE.get(e.code, 500), e.code, str(e), error_details(e)) from None
        return self._parse(event, headers)

    async def _receive_head_piece(self) -> bool:
        try:
            data = await self._sock.recv(HEAD_RECV_BYTES)
        except OSError as e:
            raise ConnectionEnds(f"the connection broke: {e!r}") from None
        self._pending += data
        return bool(data)

    def _parse(self, event: h11.Request, headers: dict[bytes, bytes]) -> AppendRequest:
        if event.method != b"POST":
            raise Refusal(405, "invalid_argument", "this socket serves appends (POST); use the API socket")
        target, _, query = event.target.partition(b"?")
        if not target.startswith(SEGMENTS_PATH.encode()):
            raise Refusal(404, "not_found", f"this socket serves {SEGMENTS_PATH}{{path}} only; use the API socket")
        declared = headers.get(b"content-length")
        if declared is None:  # h11 has checked a Content-Length's form; chunked bodies are not taken
            raise Refusal(411, "invalid_argument", "an append here needs a Content-Length")
        length = int(declared)
        limit = self._store.config.max_append_bytes
        if length > limit:
            error = AppendTooLargeError(length, limit)
            raise Refusal(413, error.code, str(error))
        name = unquote(target[len(SEGMENTS_PATH):].decode("ascii", errors="replace"))
        keep_alive = event.http_version == b"1.1" and headers.get(b"connection", b"").lower() != b"close"
        forwarded = headers.get(FORWARDED_HEADER.lower().encode(), b"")
        return AppendRequest(name, _expected_offset(query), length, keep_alive,
                             headers.get(b"expect", b"").lower() == b"100-continue", _writer(query),
                             int(forwarded) if forwarded.isdigit() else None)

    async def _receive_body(self, length: int) -> bytes:
        """The body, whole, as ``bytes`` (received into the connection's buffer)."""
        if len(self._buffer) < length:
            self._buffer = bytearray(length)
        view = memoryview(self._buffer)
        received = min(length, len(self._pending))
        view[:received] = self._pending[:received]
        del self._pending[:received]
        while received < length:
            with trio.move_on_after(BODY_STALL_S) as stalled:
                try:
                    count = await self._sock.recv_into(view[received:length])
                except OSError as e:
                    raise ConnectionEnds(f"the connection broke: {e!r}") from None
            if stalled.cancelled_caught:
                raise ConnectionEnds(f"a body stalled at {received} of {length} bytes")
            if not count:
                raise ConnectionEnds(f"the client closed at {received} of {length} body bytes")
            received += count
        body = bytes(view[:length])
        view.release()
        return body

    async def _send(self, data: bytes) -> None:
        await _send_all(self._sock, data)


def _request_head(head: bytes) -> tuple[h11.Request, dict[bytes, bytes]]:
    """A request head, parsed: the request and its headers (lower-case names)."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=REQUEST_HEAD_MAX_BYTES)
    connection.receive_data(head)
    try:
        event = connection.next_event()
    except h11.RemoteProtocolError as e:
        raise Refusal(e.error_status_hint, "invalid_argument", str(e)) from None
    if not isinstance(event, h11.Request):
        raise Refusal(400, "invalid_argument", "not an HTTP/1.1 request head")
    return event, {name: value for name, value in event.headers}


class _Append:
    """One request's append and its answer."""

    def __init__(self, store: ServedStore, sock: Connection, request: AppendRequest,
                 body: bytes) -> None:
        self._store = store
        self._sock = sock
        self._request = request
        self._body = body
        self.done = trio.Event()
        self.succeeded = False

    async def run(self) -> None:
        request, body = self._request, self._body
        marked = forwarded_request.set(request.forwarded)
        try:
            try:
                offset = await self._store.append(request.name, body, expected_offset=request.expected_offset,
                                                  writer=request.writer)
                document = json.dumps({"offset": offset, "length": len(body)}, separators=(",", ":"))
                answer = _answer(200, document.encode(), keep_alive=request.keep_alive)
                succeeded = True
            except TierFSError as e:
                answer = _error_answer(e.code, str(e), error_details(e))
                succeeded = False
            except Exception as e:
                log.exception("unexpected error appending to %r on the append socket", request.name)
                answer = _error_answer("internal", f"internal error: {type(e).__name__}")
                succeeded = False
            self._body = b""  # the engine has it (journal, tail): this copy goes
            try:
                await _send_all(self._sock, answer)
                if not succeeded:
                    self._sock.shutdown(socket.SHUT_WR)  # the last answer: the client sees the end
            except (ConnectionEnds, OSError):
                succeeded = False  # nobody hears it: nothing more runs on this connection
            self.succeeded = succeeded
        finally:
            forwarded_request.reset(marked)
            self.done.set()


def _expected_offset(query: bytes) -> int | None:
    """``expected_offset`` from the query string, checked as the API checks it."""
    raw_values = parse_qs(query.decode("ascii", errors="replace"), keep_blank_values=True).get("expected_offset")
    raw = raw_values[-1] if raw_values else ""
    if raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise Refusal(400, "invalid_argument",
                      f"query parameter expected_offset must be an integer, not {raw!r}") from None
    if value < 0:
        raise Refusal(400, "invalid_argument", "query parameter expected_offset must be >= 0")
    return value


def _writer(query: bytes) -> WriterSeq | None:
    """The append's writer identity from the query string, checked as the API checks it."""
    values = parse_qs(query.decode("ascii", errors="replace"), keep_blank_values=True)
    try:
        return WriterSeq.parse(values.get("writer", [None])[-1], values.get("writer_seq", [None])[-1])
    except InvalidArgumentError as e:
        raise Refusal(400, e.code, str(e)) from None


def _answer(status: int, body: bytes, *, keep_alive: bool,
            extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _reason(status)), b"content-type: application/json",
             b"content-length: %d" % len(body), *(b"%s: %s" % pair for pair in extra_headers)]
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _error_answer(code: str, message: str, details: dict[str, Any] | None = None, *,
                  status: int | None = None) -> bytes:
    """The API's error answer (its JSON body, status and headers; ``status`` for a
    refusal of the protocol's own); the connection then ends."""
    response = error_response(code, message, details)
    extra = tuple((key, value) for key, value in response.raw_headers
                  if key not in (b"content-length", b"content-type"))
    return _answer(status or response.status_code, bytes(response.body), keep_alive=False, extra_headers=extra)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def _send_all(sock: Connection, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[await sock.send(view):]
    except OSError as e:
        raise ConnectionEnds(f"the connection broke: {e!r}") from None

