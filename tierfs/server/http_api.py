"""The daemon's HTTP API (ASGI, Starlette routing, served by hypercorn on trio): the
route table, and the bearer-token guard of the TCP listener.

Routes (all under the daemon's Unix socket, or TCP with a bearer token):

    GET    /v1/health                         liveness + epoch
    GET    /metrics                           Prometheus text format
    GET    /v1/stat/{path}                    segment or directory info (JSON)     }
    GET    /v1/ls/{path}                      entries of a directory (JSON list)   } from the
    GET    /v1/layout/{path}                  chunk layout for direct readers      } operation
    PUT    /v1/segments/{path}                create (?durability=&parents=1)      } table
    DELETE /v1/segments/{path}                delete                               }
    POST   /v1/op/{op}                        every operation of the table, JSON body
    POST   /v1/segments/{path}                append the body (?expected_offset=N) -> {"offset"}
    GET    /v1/segments/{path}                read; standard Range header; ?unconfirmed=1;
                                              ?follow=1&offset=N&timeout=S long-polls;
                                              ?follow=1&stream=1&offset=N streams the
                                              growth in one long-lived response

Each group of handlers is its own module: ``segment_routes`` (health, append),
``reads`` (reads, follow), ``follow_stream`` (streamed follows), ``op_route`` (every
route of the operation table), ``metrics``; errors become statuses in ``statuses`` only.

Invariants:
- Errors are JSON ``{"error": {"code", "message", "details"}}``; ``STATUS_BY_CODE``
  (``statuses``) is the only place tierfs errors become HTTP statuses.
- Reads stream in bounded pieces through one ``SegmentReader`` (read-ahead), so a
  large GET never holds the whole range in memory.
- Names are validated by the engine (``names.canonical``) before anything happens;
  nothing here touches the journal or chunks directly.
- A name reaches the engine exactly as the client sent it: clients percent-encode every
  character that a URL could rewrite ('/', '.', control characters), the server
  decodes them back, and the ``name`` convertor matches any decoded text, newlines
  included, so a bad name is 400 ``invalid_name``, never a 404 of a mangled path.
"""

from __future__ import annotations

import trio
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tierfs.cluster.forwarding import forwarded_request
from tierfs.contracts.error_wire import error_details
from tierfs.contracts.errors import TierFSError
from tierfs.contracts.operations import FORWARDED_HEADER
from tierfs.server.credentials import TcpCredentials
from tierfs.server.follow_stream import FollowStreams
from tierfs.server.metrics import MetricsRoute
from tierfs.server.op_route import operation_routes
from tierfs.server.reads import ReadRoutes
from tierfs.server.segment_routes import SegmentRoutes
from tierfs.server.statuses import error_response, tierfs_error, unexpected_error
from tierfs.store.served import ServedStore


class NameConvertor(Convertor[str]):
    """A segment or directory name: any text, '/' and newlines included (``path`` stops
    at a newline); the engine decides what is valid."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("name", NameConvertor())


def build_app(store: ServedStore, streams: FollowStreams | None = None) -> ASGIApp:
    """The API over ``store``; ``streams`` holds its streaming follows (the daemon keeps
    it to end them when it stops)."""
    return WholeRequestRead(api_routes(store, streams))


def api_routes(store: ServedStore, streams: FollowStreams | None = None) -> ASGIApp:
    """The API's routes over ``store``, without ``WholeRequestRead`` (the daemon puts the
    TCP listener's ``BearerTokenAuth`` inside it, so a refusal waits for the body too)."""
    segments, reads = SegmentRoutes(store), ReadRoutes(store, streams or FollowStreams(store))
    routes = [
        Route("/v1/health", segments.health),
        Route("/metrics", MetricsRoute(store).get),
        Route("/v1/segments/{path:name}", segments.append, methods=["POST"]),
        Route("/v1/segments/{path:name}", reads.read, methods=["GET"]),
        *operation_routes(store),
    ]
    return ForwardedMarker(Starlette(
        routes=routes,
        exception_handlers={TierFSError: tierfs_error, Exception: unexpected_error},
    ))


class WholeRequestRead:
    """ASGI middleware: a response starts only once its request's body has arrived, read
    or not, so the connection stays usable for the client's next request.

    An error answered before the body (an append refused for its offset, a bad token, an
    unknown operation) would otherwise race the body's last bytes: when the response
    ends first, the server must close the connection, and a client that reuses it for
    its next request gets "disconnected without a response" for a request the daemon
    never saw. Only requests that declare a body wait; one past
    ``UNREAD_BODY_LIMIT_BYTES`` is not waited for (that response ends the connection).
    While the app itself is reading (a disconnect listener), this waits for what it
    reads instead of reading beside it."""

    UNREAD_BODY_LIMIT_BYTES = 1 << 20

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", ())) if scope["type"] == "http" else {}
        if headers.get(b"content-length", b"0") in (b"0", b"") and b"transfer-encoding" not in headers:
            await self._app(scope, receive, send)
            return
        body_done = False
        readers = 0
        arrived = trio.Event()

        async def tracked_receive() -> Message:
            nonlocal body_done, readers, arrived
            readers += 1
            try:
                message = await receive()
            finally:
                readers -= 1
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            arrived.set()
            arrived = trio.Event()
            return message

        async def send_after_body(message: Message) -> None:
            skipped = 0
            while message["type"] == "http.response.start" and not body_done \
                    and skipped <= self.UNREAD_BODY_LIMIT_BYTES:
                if readers:
                    await arrived.wait()
                else:
                    skipped += len((await tracked_receive()).get("body", b""))
            await send(message)

        await self._app(scope, tracked_receive, send_after_body)


class ForwardedMarker:
    """ASGI middleware: a request another cluster daemon forwarded for one container
    (its header) is marked for the router (``cluster.forwarding``), which serves it from
    that container's store only and never forwards it again."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._header = FORWARDED_HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        container = next((value for key, value in scope.get("headers", ()) if key == self._header), None)
        if scope["type"] == "http" and container is not None and container.isdigit():
            token = forwarded_request.set(int(container))
            try:
                await self._app(scope, receive, send)
            finally:
                forwarded_request.reset(token)
            return
        await self._app(scope, receive, send)


class BearerTokenAuth:
    """ASGI middleware: every request must carry credentials ``credentials`` allows
    (``server/credentials``): the daemon's token, or a registered peer's."""

    def __init__(self, app: ASGIApp, credentials: TcpCredentials) -> None:
        self._app = app
        self._credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                await self._credentials.check(dict(scope["headers"]))
            except TierFSError as e:  # unauthorized, or the peer registry cannot be read
                await error_response(e.code, str(e), error_details(e))(scope, receive, send)
                return
        await self._app(scope, receive, send)
