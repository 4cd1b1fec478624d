"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 in front of an S3-protocol server.

Point a store's ``endpoint_url`` at ``proxy.url`` instead of the server's (moto in the
tests, s3rver in the benchmarks) and switch faults on and off while it runs:

- ``slowdown_rate``: the request is answered ``503 SlowDown`` with S3's XML error body,
  without reaching the server (the request body is read first, as S3 does);
- ``reset_rate``: the request reaches the server, the client gets the status line, the
  headers and half the body, then a TCP reset (``SO_LINGER`` 0); a response without a
  body (HEAD, PUT) is reset before its status line;
- ``stall_rate``: the same first half (nothing, for a response without a body), then
  nothing for ``stall_s`` seconds (longer than any read timeout worth having), then
  the rest;
- ``outage(seconds)``: "S3 unreachable": every connection, new or kept alive, is reset
  at once until the period ends.

Each request draws one fault (or none) from ``random.Random(seed)``; ``methods`` limits
faults to some HTTP methods (e.g. only ``GET`` for a cold-read test whose writes must
go through), ``max_faults`` to a number of faults (counted from when ``faults`` is set). Requests are parsed and re-serialised with h11, so bodies (fixed length
or chunked), ``Expect: 100-continue`` and keep-alive on both sides work as with the
server itself; response bodies are buffered whole (objects in tests and benchmarks are
at most tens of MiB).

Invariants:
- The proxy never alters a byte it forwards: a response either arrives whole and
  unchanged, or visibly broken (reset, 503), or late (stall).
- ``FaultProxy`` runs its own trio loop in a daemon thread; ``faults`` is replaced
  whole (a frozen dataclass), so a change applies from the next request on. Counters
  are plain integers read by other threads (safe under the GIL).
- ``python -m tierfs.testing.faults.fault_proxy UPSTREAM [--slowdown R ...]`` runs one in the
  foreground (benchmarks use a separate process so the proxy never competes with the
  code under test for the GIL); it prints ``listening on 127.0.0.1:PORT`` once ready,
  starts an outage of ``--outage-s`` on SIGUSR1 and, on SIGTERM or SIGINT, prints its
  counters as one JSON line before it exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from urllib.parse import urlsplit

import h11
import trio

log = logging.getLogger(__name__)

RECEIVE_BYTES = 256 << 10
CONNECT_TIMEOUT_S = 10.0
ALL_METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE"})


@dataclasses.dataclass(frozen=True)
class Faults:
    """Fault rates per request (their sum at most 1) and the stall's length."""

    slowdown_rate: float = 0.0
    reset_rate: float = 0.0
    stall_rate: float = 0.0
    stall_s: float = 5.0
    methods: frozenset[str] = ALL_METHODS
    # only requests whose path holds this text (e.g. "/s0" for chunk objects, so the
    # owner-claim checks and metadata backups beside them go through untouched)
    path_contains: str = ""
    # at most this many faults from now on (then none): a test can stall exactly one GET
    max_faults: int | None = None

    def __post_init__(self) -> None:
        if min(self.slowdown_rate, self.reset_rate, self.stall_rate) < 0 or self.total_rate > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1: {self}")

    @property
    def total_rate(self) -> float:
        return self.slowdown_rate + self.reset_rate + self.stall_rate


@dataclasses.dataclass
class ProxyCounters:
    requests: int = 0
    slowdowns: int = 0
    resets: int = 0
    stalls: int = 0
    refused: int = 0  # connections or requests reset during an outage

    @property
    def faults(self) -> int:
        return self.slowdowns + self.resets + self.stalls


def slowdown_body(resource: str) -> bytes:
    """S3's XML error body for 503 SlowDown."""
    request_id = uuid.uuid4().hex[:16].upper()
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>tierfs-fault-proxy</HostId></Error>"
    ).encode()


class _Reset(Exception):
    """The client connection was reset on purpose (fault or outage)."""


async def _next_event(stream: trio.SocketStream, conn: h11.Connection) -> object:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(RECEIVE_BYTES))
            continue
        return event


async def _read_body(stream: trio.SocketStream, conn: h11.Connection) -> bytes:
    body = bytearray()
    while True:
        event = await _next_event(stream, conn)
        if isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif isinstance(event, h11.InformationalResponse):
            continue
        else:
            raise h11.RemoteProtocolError(f"unexpected {event!r} in a body")


async def _reset(stream: trio.SocketStream) -> None:
    """Close with a TCP RST rather than a FIN."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    await stream.aclose()


def _without(headers: Iterable[tuple[bytes, bytes]], names: set[bytes]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() not in names]


class _Upstream:
    """One kept-alive connection to the S3 server, opened when first needed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.conn = h11.Connection(h11.CLIENT)

    async def exchange(self, request: h11.Request, body: bytes) -> tuple[h11.Response, bytes]:
        if self.stream is None or self.conn.our_state is not h11.IDLE:
            await self.close()
            with trio.fail_after(CONNECT_TIMEOUT_S):
                self.stream = await trio.open_tcp_stream(self.host, self.port)
            self.conn = h11.Connection(h11.CLIENT)
        stream, conn = self.stream, self.conn
        headers = _without(request.headers, {b"expect", b"transfer-encoding", b"content-length"})
        if body or request.method in (b"PUT", b"POST"):
            headers.append((b"content-length", str(len(body)).encode()))
        out = conn.send(h11.Request(method=request.method, target=request.target, headers=headers))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
        await stream.send_all(out)
        while True:
            event = await _next_event(stream, conn)
            if isinstance(event, h11.Response):
                break
            if not isinstance(event, h11.InformationalResponse):
                raise h11.RemoteProtocolError(f"unexpected {event!r} from the server")
        response_body = await _read_body(stream, conn)
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.close()
        return event, response_body

    async def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            await stream.aclose()


class FaultProxy:
    """The proxy; ``with FaultProxy(upstream_url) as proxy:`` serves on ``proxy.url``."""

    def __init__(self, upstream_url: str, faults: Faults | None = None, *, seed: int | None = None) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream must be http://HOST:PORT, not {upstream_url!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.counters = ProxyCounters()
        self.faults = faults or Faults()
        self.port = 0
        self._random = random.Random(seed)
        self._unreachable_until_s = 0.0
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self._faults, self._faults_before = faults, self.counters.faults

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def outage(self, seconds: float) -> None:
        """S3 unreachable for ``seconds`` from now: every connection is reset."""
        self._unreachable_until_s = time.monotonic() + seconds

    def end_outage(self) -> None:
        self._unreachable_until_s = 0.0

    @property
    def unreachable(self) -> bool:
        return time.monotonic() < self._unreachable_until_s

    # ------------------------------------------------------------ running
    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run_thread, name="fault-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error!r}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None and self._cancel is not None:
            try:
                trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run_thread(self) -> None:
        try:
            trio.run(self.serve)
        except BaseException as e:  # reported to __enter__ if it never started
            self._error = e
            self._ready.set()

    async def serve(self, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(port)`` once listening."""
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._cancel:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self.port)
                self._ready.set()

    # ------------------------------------------------------------ one connection
    async def _handle(self, client: trio.SocketStream) -> None:
        upstream = _Upstream(self.upstream_host, self.upstream_port)
        try:
            await self._serve_connection(client, upstream)
        except _Reset:
            pass
        except Exception as e:  # one broken connection never stops the proxy
            log.debug("fault proxy connection ended: %r", e)
        finally:
            await upstream.close()
            with trio.CancelScope(shield=True):
                await client.aclose()

    async def _serve_connection(self, client: trio.SocketStream, upstream: _Upstream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            if self.unreachable:
                self.counters.refused += 1
                await _reset(client)
                raise _Reset
            event = await _next_event(client, conn)
            if isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                raise h11.RemoteProtocolError(f"unexpected {event!r} from the client")
            request = event
            if conn.client_is_waiting_for_100_continue:
                await client.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            body = await _read_body(client, conn)
            if self.unreachable:
                self.counters.refused += 1
                await _reset(client)
                raise _Reset
            self.counters.requests += 1
            fault = self._draw(request.method.decode(), urlsplit(request.target.decode()).path)
            if fault == "slowdown":
                await self._send_slowdown(client, conn, request)
            else:
                response, response_body = await upstream.exchange(request, body)
                await self._send_response(client, conn, request, response, response_body, fault)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    def _draw(self, method: str, path: str) -> str:
        """The fault for this request ("" for none), counted at once so ``max_faults``
        holds with requests in flight."""
        faults, counters = self._faults, self.counters
        if method not in faults.methods or faults.total_rate == 0 or faults.path_contains not in path:
            return ""
        if faults.max_faults is not None and counters.faults - self._faults_before >= faults.max_faults:
            return ""
        draw = self._random.random()
        if draw < faults.slowdown_rate:
            counters.slowdowns += 1
            return "slowdown"
        draw -= faults.slowdown_rate
        if draw < faults.reset_rate:
            counters.resets += 1
            return "reset"
        draw -= faults.reset_rate
        if draw < faults.stall_rate:
            counters.stalls += 1
            return "stall"
        return ""

    async def _send_slowdown(self, client: trio.SocketStream, conn: h11.Connection, request: h11.Request) -> None:
        body = slowdown_body(urlsplit(request.target.decode()).path)
        headers = [(b"content-type", b"application/xml"), (b"content-length", str(len(body)).encode())]
        out = conn.send(h11.Response(status_code=503, headers=headers, reason=b"Slow Down"))
        if request.method != b"HEAD":
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
        await client.send_all(out)

    async def _send_response(
        self, client: trio.SocketStream, conn: h11.Connection, request: h11.Request,
        response: h11.Response, body: bytes, fault: str,
    ) -> None:
        headers = list(response.headers)
        if request.method != b"HEAD" and response.status_code not in (204, 304):
            headers = _without(headers, {b"transfer-encoding", b"content-length"})
            headers.append((b"content-length", str(len(body)).encode()))
        head = conn.send(h11.Response(status_code=response.status_code, headers=headers, reason=response.reason))
        if not fault:
            out = head + (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage())
            await client.send_all(out)
            return
        half = len(body) // 2
        if half:  # mid-body; a response without a body is held back whole
            await client.send_all(head + conn.send(h11.Data(data=body[:half])))
        if fault == "reset":
            await _reset(client)
            raise _Reset
        await trio.sleep(self._faults.stall_s)
        rest = body[half:]
        out = b"" if half else head
        await client.send_all(out + (conn.send(h11.Data(data=rest)) if rest else b"") + conn.send(h11.EndOfMessage()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.faults.fault_proxy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("upstream", help="the S3 server, http://HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--slowdown", type=float, default=0.0, help="rate of 503 SlowDown answers")
    parser.add_argument("--reset", type=float, default=0.0, help="rate of resets mid-body")
    parser.add_argument("--stall", type=float, default=0.0, help="rate of stalls mid-body")
    parser.add_argument("--stall-s", type=float, default=5.0, help="length of a stall (s)")
    parser.add_argument("--methods", default=",".join(sorted(ALL_METHODS)), help="methods faults apply to")
    parser.add_argument("--outage-s", type=float, default=10.0,
                        help="SIGUSR1 makes S3 unreachable for this long (default 10 s)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    faults = Faults(args.slowdown, args.reset, args.stall, args.stall_s,
                    frozenset(m.strip().upper() for m in args.methods.split(",") if m.strip()))
    proxy = FaultProxy(args.upstream, faults, seed=args.seed)
    proxy.port = args.port

    async def serve() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGUSR1) as signals:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(proxy.serve)
                print(f"listening on 127.0.0.1:{port}", flush=True)
                async for received in signals:
                    if received == signal.SIGUSR1:
                        proxy.outage(args.outage_s)
                        continue
                    nursery.cancel_scope.cancel()
                    break
        print(json.dumps(dataclasses.asdict(proxy.counters)), flush=True)

    trio.run(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
