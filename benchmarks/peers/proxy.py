"""A counting TCP proxy on 127.0.0.1 in front of the S3 server, for ``benchmarks peers``:
every system reaches s3rver through it, so each operation's S3 traffic is the difference
of two snapshots: requests by HTTP method, bytes sent to S3 (request heads and bodies)
and received from it, attributed to the method of the request they answer.

One thread per direction per connection relays the raw bytes unchanged (blocking
``recv_into``/``sendall``, which release the GIL). The client-to-server bytes are also
framed into HTTP/1.1 requests (a head, then ``Content-Length`` bytes), only to count
them: what cannot be framed (a chunked body, a head past 64 KiB) is still forwarded, and
the rest of that connection is counted under its method or ``"?"``. Responses belong to
the last request sent on their connection (S3 clients do not pipeline).

Invariants: the proxy never alters, drops or reorders a byte; counters only grow and a
snapshot is taken under the lock. ``python -m benchmarks.peers.proxy HOST:PORT`` runs in
a process of its own (the relay never competes for the GIL with the timed loops),
answering each JSON request line with the counters (``CountingProxy`` drives it).
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from benchmarks.harness.child import JsonLineChild, serve

RELAY_BUFFER_BYTES = 1 << 20  # one recv per MiB at most: S3 bodies here are MiB-sized
MAX_HEAD_BYTES = 64 << 10
UNFRAMED = "?"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


@dataclasses.dataclass
class MethodTraffic:
    requests: int = 0
    bytes_up: int = 0  # to S3: request line, headers, body
    bytes_down: int = 0  # from S3: status line, headers, body


Traffic = dict[str, MethodTraffic]


def traffic_difference(after: Traffic, before: Traffic) -> Traffic:
    """What happened between two snapshots (methods with no traffic left out)."""
    result: Traffic = {}
    for method, now in after.items():
        then = before.get(method, MethodTraffic())
        delta = MethodTraffic(now.requests - then.requests, now.bytes_up - then.bytes_up,
                              now.bytes_down - then.bytes_down)
        if delta.requests or delta.bytes_up or delta.bytes_down:
            result[method] = delta
    return result


def total(traffic: Traffic) -> MethodTraffic:
    return MethodTraffic(sum(t.requests for t in traffic.values()), sum(t.bytes_up for t in traffic.values()),
                         sum(t.bytes_down for t in traffic.values()))


TRAFFIC: Traffic = {}  # the proxy process's counters, shared by every relay thread
LOCK = threading.Lock()


def count(method: str, requests: int = 0, up: int = 0, down: int = 0) -> None:
    with LOCK:
        entry = TRAFFIC.setdefault(method, MethodTraffic())
        entry.requests, entry.bytes_up, entry.bytes_down = (
            entry.requests + requests, entry.bytes_up + up, entry.bytes_down + down)


class RequestFramer:
    """Counts one connection's client-to-server bytes by the request they belong to."""

    def __init__(self) -> None:
        self.method = UNFRAMED
        self._head = bytearray()
        self._body_left = 0  # -1: framing lost, the rest of the connection is the current method's

    def feed(self, data: memoryview | bytes) -> None:
        while data:
            if self._body_left:
                used = len(data) if self._body_left < 0 else min(self._body_left, len(data))
                count(self.method, up=used)
                self._body_left -= 0 if self._body_left < 0 else used
                data = data[used:]
                continue
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    count(UNFRAMED, up=len(self._head))
                    self.method, self._body_left = UNFRAMED, -1
                    self._head.clear()
                return
            head, data = bytes(self._head[: end + 4]), bytes(self._head[end + 4 :])
            self._head.clear()
            self.method = head.split(b" ", 1)[0].decode("ascii", "replace") or UNFRAMED
            count(self.method, requests=1, up=len(head))
            length = _CONTENT_LENGTH.search(head)
            self._body_left = -1 if b"chunked" in head.lower() else int(length.group(1)) if length else 0


def relay(source: socket.socket, sink: socket.socket, count: Callable[[memoryview], None]) -> None:
    """Bytes from ``source`` to ``sink`` until ``source`` ends; then the end passed on."""
    buffer = bytearray(RELAY_BUFFER_BYTES)
    view = memoryview(buffer)
    try:
        while received := source.recv_into(buffer):
            count(view[:received])
            sink.sendall(view[:received])
    except OSError:
        pass
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def connection(client: socket.socket, upstream: tuple[str, int]) -> None:
    """One client connection relayed to its own upstream connection, both ways."""
    with client, socket.create_connection(upstream) as server:
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        framer = RequestFramer()
        up = threading.Thread(target=relay, args=(client, server, framer.feed), daemon=True)
        up.start()
        relay(server, client, lambda piece: count(framer.method, down=len(piece)))
        up.join()


def main(argv: list[str]) -> int:
    host, _, port = argv[0].rpartition(":")
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=connection, args=(client, (host, int(port))), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    def snapshot(_: object) -> dict[str, dict[str, int]]:
        with LOCK:
            return {method: dataclasses.asdict(t) for method, t in TRAFFIC.items()}

    return serve(snapshot)


class CountingProxy(JsonLineChild):
    """``python -m benchmarks.peers.proxy`` as a child process (see the module docstring)."""

    def __init__(self, upstream_url: str, log_path: Path) -> None:
        super().__init__("benchmarks.peers.proxy", upstream_url.split("://", 1)[-1].rstrip("/"), log_path=log_path)
        self.url = f"http://127.0.0.1:{self.answer()['port']}"

    def snapshot(self) -> Traffic:
        return {method: MethodTraffic(**fields) for method, fields in self.request({}).items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
