"""A counting TCP proxy on 127.0.0.1 in front of the S3 server, for ``benchmarks peers``:
every system reaches s3rver through it, so each operation's S3 traffic is the difference
of two snapshots: requests by HTTP method, bytes sent to S3 (request heads and bodies)
and received from it, attributed to the method of the request they answer.

One thread per direction per connection relays the raw bytes unchanged (blocking
``recv_into``/``sendall``, which release the GIL). The client-to-server direction is
also fed to ``RequestCounter``, an incremental HTTP/1.1 request framer (head, then
``Content-Length`` bytes or chunked coding) that only counts: a byte it cannot frame is
still forwarded, and the bytes after it are counted under ``"?"``. Responses belong to
the last request sent on their connection (S3 clients do not pipeline).

Invariants: the proxy never alters, drops or reorders a byte; counters only grow and a
snapshot is taken under the lock. ``python -m benchmarks.peers.proxy HOST:PORT`` runs in
a process of its own (the relay never competes for the GIL with the timed loops),
answering each JSON request line with the counters (``CountingProxy`` drives it).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.harness.child import JsonLineChild
from benchmarks.harness.child import serve as serve_requests

RELAY_BUFFER_BYTES = 1 << 20  # one recv per MiB at most: S3 bodies here are MiB-sized
MAX_HEAD_BYTES = 64 << 10  # a request head longer than this is not HTTP we can frame
UNFRAMED = "?"  # the method bytes are counted under once the framer lost track


@dataclasses.dataclass
class MethodTraffic:
    requests: int = 0
    bytes_up: int = 0  # to S3: request line, headers, body
    bytes_down: int = 0  # from S3: status line, headers, body


Traffic = dict[str, MethodTraffic]


def traffic_from_json(value: dict[str, dict[str, int]]) -> Traffic:
    return {method: MethodTraffic(**fields) for method, fields in value.items()}


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


class RequestCounter:
    """Frames the client-to-server byte stream of one connection into HTTP/1.1 requests
    and tells which method each byte belongs to. Never raises: on anything it cannot
    frame it counts the rest of the connection under ``UNFRAMED``."""

    def __init__(self) -> None:
        self.method = UNFRAMED  # the request the bytes being fed belong to
        self._head = bytearray()
        self._state = "head"  # head | body | chunk-size | chunk-data | trailer | lost
        self._left = 0  # body or chunk bytes (with its CRLF) still to come

    def feed(self, data: memoryview) -> list[tuple[str, int, bool]]:
        """Account ``data``: [(method, bytes, starts_a_request)], in order."""
        pieces: list[tuple[str, int, bool]] = []
        position = 0
        while position < len(data):
            if self._state == "lost":
                pieces.append((UNFRAMED, len(data) - position, False))
                break
            if self._state in ("body", "chunk-data"):
                used = min(self._left, len(data) - position)
                pieces.append((self.method, used, False))
                position += used
                self._left -= used
                if self._left == 0:
                    self._state = "head" if self._state == "body" else "chunk-size"
                continue
            # head, chunk-size, trailer: line-oriented, consumed up to the line end
            end_mark = b"\r\n\r\n" if self._state == "head" else b"\r\n"
            start = len(self._head)
            self._head += data[position : position + MAX_HEAD_BYTES]  # not a whole body
            found = self._head.find(end_mark, max(0, start - len(end_mark) + 1))
            if found < 0:
                pieces.append((self._pending_method(), len(data) - position, False))
                if len(self._head) > MAX_HEAD_BYTES:
                    self._state = "lost"
                return pieces
            used = found + len(end_mark) - start
            line = bytes(self._head[: found + len(end_mark)])
            self._head.clear()
            position += used
            starts = self._state == "head"
            if starts:
                self._start_request(line)
            elif self._state == "chunk-size":
                self._chunk_size(line)
            elif line == b"\r\n":  # trailer: an empty line ends the message
                self._state = "head"
            pieces.append((self.method, used, starts))
        return pieces

    def _pending_method(self) -> str:
        if self._state != "head":
            return self.method
        word = bytes(self._head).split(b" ", 1)[0]
        return word.decode("ascii", "replace") if b" " in self._head else self.method

    def _start_request(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.method = lines[0].split(b" ", 1)[0].decode("ascii", "replace") or UNFRAMED
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    self._state = "lost"
                    return
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            self._state = "chunk-size"
        elif length > 0:
            self._state, self._left = "body", length
        else:
            self._state = "head"

    def _chunk_size(self, line: bytes) -> None:
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            self._state = "lost"
            return
        if size == 0:
            self._state = "trailer"
        else:
            self._state, self._left = "chunk-data", size + 2  # the data and its CRLF


class Counters:
    """Traffic by method, shared by every relay thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._traffic: Traffic = {}

    def add(self, method: str, *, requests: int = 0, up: int = 0, down: int = 0) -> None:
        with self._lock:
            entry = self._traffic.setdefault(method, MethodTraffic())
            entry.requests += requests
            entry.bytes_up += up
            entry.bytes_down += down

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {method: dataclasses.asdict(t) for method, t in self._traffic.items()}


class _Connection:
    """One client connection and its upstream connection, relayed by two threads."""

    def __init__(self, client: socket.socket, upstream: socket.socket, counters: Counters) -> None:
        self.client, self.upstream, self.counters = client, upstream, counters
        self.framer = RequestCounter()
        self._open_directions = 2
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._relay_up, daemon=True).start()
        threading.Thread(target=self._relay_down, daemon=True).start()

    def _relay_up(self) -> None:
        buffer = bytearray(RELAY_BUFFER_BYTES)
        view = memoryview(buffer)
        try:
            while received := self.client.recv_into(buffer):
                for method, nbytes, starts in self.framer.feed(view[:received]):
                    self.counters.add(method, requests=int(starts), up=nbytes)
                self.upstream.sendall(view[:received])
        except OSError:
            pass
        self._finish(self.upstream)

    def _relay_down(self) -> None:
        buffer = bytearray(RELAY_BUFFER_BYTES)
        view = memoryview(buffer)
        try:
            while received := self.upstream.recv_into(buffer):
                self.counters.add(self.framer.method, down=received)
                self.client.sendall(view[:received])
        except OSError:
            pass
        self._finish(self.client)

    def _finish(self, peer: socket.socket) -> None:
        """One direction ended: pass the end on; close both once both have ended."""
        try:
            peer.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            self._open_directions -= 1
            done = self._open_directions == 0
        if done:
            self.client.close()
            self.upstream.close()


def serve(listener: socket.socket, upstream: tuple[str, int], counters: Counters) -> None:
    """Accept connections for ever (a daemon thread of the proxy process)."""
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(upstream)
        except OSError:
            client.close()
            continue
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _Connection(client, server, counters).start()


def main(argv: list[str]) -> int:
    host, _, port = argv[0].rpartition(":")
    counters = Counters()
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    threading.Thread(target=serve, args=(listener, (host, int(port)), counters), daemon=True).start()
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    return serve_requests(lambda _: counters.snapshot())


class CountingProxy(JsonLineChild):
    """``python -m benchmarks.peers.proxy`` as a child process (see the module docstring)."""

    def __init__(self, upstream_url: str, log_path: Path) -> None:
        super().__init__("benchmarks.peers.proxy", upstream_url.split("://", 1)[-1].rstrip("/"), log_path=log_path)
        self.url = f"http://127.0.0.1:{self.answer()['port']}"

    def snapshot(self) -> Traffic:
        return traffic_from_json(self.request({}))


@contextmanager
def counting_proxy(upstream_url: str, log_path: Path) -> Iterator[CountingProxy]:
    proxy = CountingProxy(upstream_url, log_path)
    try:
        yield proxy
    finally:
        proxy.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
