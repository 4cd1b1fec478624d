"""The follow socket, ``<data_dir>/tierfs-follow.sock``: a lean HTTP/1.1 server of
segment reads, for long-lived streamed follows (``GET /v1/segments/{path}?follow=1&stream=1``).

Why: a streamed follow sends many small pieces, one per wake-up. Through hypercorn and
Starlette each piece costs the event loop an ASGI send through two middlewares, an h11
event, a lock, a shielded cancel scope and several schedule points: about 55 us of CPU
per piece, against about 18 us here (``python -m benchmarks followers``), which is the
difference between a thousand followers fitting in one core or not. Here a connection carries one request, parsed by h11 and
answered by the API's own read route (``ReadRoutes.read``: the same checks, headers and
errors); the response head is built by h11 and each body piece goes straight to the
socket as one chunk. A follow that has caught up parks its socket on the segment's feed
(``follow_feed``), which writes the next pieces to it in the same step as to every
other caught-up follower: no task switch per follower and piece.

Invariants:
- One ``GET /v1/segments/{path}`` without a body per connection, then the connection
  closes (no keep-alive, no pipelining); anything else is refused (405, 404, 400)
  before the store is asked, and a request head must arrive within
  ``REQUEST_TIMEOUT_S`` and ``REQUEST_HEAD_MAX_BYTES``.
- The answers are the API's: the same route, status codes and JSON errors.
- Owner-only like the API socket (0600 inside the 0700 data dir); the listen backlog
  is the daemon's (sized for thousands of followers connecting at once).
- A client that closes its connection ends its request at once (a task per connection
  watches for the end of its input); when the daemon stops, accepting stops and open
  connections get ``listeners.STOP_GRACE_S`` to end.
"""

from __future__ import annotations

import json
import logging
import os
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote

import h11
import trio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tierfs.contracts.errors import TierFSError
from tierfs.server.follow_feed import Framing
from tierfs.server.follow_stream import FollowResponse, StreamCursor
from tierfs.server.listeners import serve_unix_socket
from tierfs.server.reads import ReadRoutes
from tierfs.server.statuses import tierfs_error, unexpected_error

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0  # a connection must send its request head within this
REQUEST_HEAD_MAX_BYTES = 16 << 10
RECEIVE_BYTES = 4096  # reads after the request only watch for the client closing
SEGMENTS_PATH = "/v1/segments/"


async def serve_stream_socket(
    reads: ReadRoutes, path: Path, backlog: int, stop: trio.Event,
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve segment reads on the Unix socket ``path`` until ``stop`` is set."""

    async def handle(stream: trio.SocketStream) -> None:
        await _serve_connection(reads, stream)

    await serve_unix_socket(path, backlog, stop, handle, task_status=task_status)


async def _serve_connection(reads: ReadRoutes, stream: trio.SocketStream) -> None:
    async with stream:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=REQUEST_HEAD_MAX_BYTES)
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                request = await _read_request(stream, connection)
            if request is None:
                return
            refusal = _refusal(request)
            if refusal is not None:
                await _send_refusal(stream, connection, *refusal)
                return
            async with trio.open_nursery() as nursery:  # the client closing ends the request
                nursery.start_soon(_cancel_at_end_of_input, stream, nursery.cancel_scope)
                await _answer(reads, stream, connection, request)
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            return  # the client went away, or never sent a whole request
        except h11.RemoteProtocolError as e:
            if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send_refusal(stream, connection, e.error_status_hint, "invalid_argument", str(e))
        except Exception:  # a stream that cannot go on: cut short (its client sees an error)
            log.exception("a read on the follow socket failed after its head was sent")


async def _read_request(stream: trio.SocketStream, connection: h11.Connection) -> h11.Request | None:
    while True:
        event = connection.next_event()
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(RECEIVE_BYTES))
            continue
        return None  # the client closed before sending a request


def _refusal(request: h11.Request) -> tuple[int, str, str] | None:
    if request.method != b"GET":
        return 405, "invalid_argument", "this socket serves segment reads (GET); use the API socket"
    if not request.target.startswith(SEGMENTS_PATH.encode()):
        return 404, "not_found", f"this socket serves {SEGMENTS_PATH}{{path}} only; use the API socket"
    if any(name in (b"content-length", b"transfer-encoding") and value != b"0" for name, value in request.headers):
        return 400, "invalid_argument", "a GET here carries no body"
    return None


async def _send_refusal(stream: trio.SocketStream, connection: h11.Connection, status: int, code: str,
                        message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()
    head = h11.Response(status_code=status, reason=_reason(status), headers=[
        ("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")])
    await stream.send_all(connection.send(head) + body)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def _cancel_at_end_of_input(stream: trio.SocketStream, scope: trio.CancelScope) -> None:
    """Nothing follows the request: wait for the client to close, then cancel."""
    try:
        while await stream.receive_some(RECEIVE_BYTES):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


async def _answer(reads: ReadRoutes, stream: trio.SocketStream, connection: h11.Connection,
                  request: h11.Request) -> None:
    target, _, query = request.target.partition(b"?")
    name = unquote(target[len(SEGMENTS_PATH):].decode("ascii"))
    asgi_request = Request({
        "type": "http", "method": "GET", "scheme": "http", "server": None, "root_path": "",
        "path": unquote(target.decode("ascii")), "query_string": query, "headers": list(request.headers),
        "path_params": {"path": name},
    })
    response: Response
    try:
        response = await reads.read(asgi_request)
    except TierFSError as e:
        response = await tierfs_error(asgi_request, e)
    except Exception as e:
        response = await unexpected_error(asgi_request, e)
    headers = [(key, value) for key, value in response.raw_headers if key != b"connection"]
    chunked = request.http_version == b"1.1" and not any(key == b"content-length" for key, _ in headers)
    head = h11.Response(status_code=response.status_code, headers=[*headers, (b"connection", b"close")],
                        reason=_reason(response.status_code))
    await stream.send_all(connection.send(head))
    if isinstance(response, FollowResponse):
        await _follow(stream, response.cursor, _chunk if chunked else _raw)
    elif isinstance(response, StreamingResponse):
        await _stream(stream, response, _chunk if chunked else _raw)
    else:
        await stream.send_all(response.body)
        return
    if chunked:
        await stream.send_all(b"0\r\n\r\n")


def _chunk(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece)


def _raw(piece: bytes) -> bytes:
    return piece


async def _follow(stream: trio.SocketStream, cursor: StreamCursor, frame: Framing) -> None:
    """A streamed follow: each piece as it comes; once caught up, the socket parks on
    the feed, which writes the next pieces itself until it cannot (no task step per
    piece while the follower keeps up)."""
    fd = stream.socket.fileno()
    try:
        while (piece := await cursor.next_piece()) is not None:
            await _send_piece(stream, frame(piece))
            while cursor.caught_up:
                pending = await cursor.park(fd, frame)
                if not pending:
                    break  # a tick, or the feed closed: next_piece decides whether to go on
                await _send_piece(stream, pending)
    except BrokenPipeError as e:
        raise trio.BrokenResourceError(str(e)) from None
    finally:
        cursor.close()


async def _stream(stream: trio.SocketStream, response: StreamingResponse, frame: Framing) -> None:
    """Any other streamed answer (a ranged read), piece by piece."""
    pieces = response.body_iterator
    try:
        async for piece in pieces:
            body = piece.encode() if isinstance(piece, str) else bytes(piece)
            if body:
                await _send_piece(stream, frame(body))
    finally:
        close = getattr(pieces, "aclose", None)
        if close is not None:  # left early (client gone, cancelled): its reader is let go now
            with trio.CancelScope(shield=True):
                await close()


async def _send_piece(stream: trio.SocketStream, data: bytes) -> None:
    """``send_all`` without its schedule point when the socket takes the piece at once
    (the follower's wake-up was one; this halves the event loop's passes per piece);
    waits for room when it does not, so a slow follower holds this piece only."""
    fd = stream.socket.fileno()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd)
        except OSError as e:
            raise trio.BrokenResourceError(f"the follower's connection broke: {e!r}") from None
