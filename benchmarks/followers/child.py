"""The processes of the ``followers`` benchmark: followers (JSON lines, ``harness.child``)
and the ceiling, a fan-out server.

A follower process: request 1 (``source``, ``address``, ``segments``, ``followers``: the
segment of each, ``clients``, ``via``, ``sample_every``, ``ready_timeout_s``) starts the
followers: with ``threads`` a thread each (tierfs: ``TierClient.follow`` on one shared
client, as an fsspec filesystem is shared; the reference: a Unix socket to the fan-out
server); with ``trio`` a trio task each in one thread, speaking the streamed follow
itself (h11 for the head, the chunked body by hand) on the follow or the API socket: a
thousand threads on 2 cores put a thousand wake-ups in the run queue every few appends.
It answers once every follower has line 0. Request 2 (``last_seq``, ``deadline_s``)
waits for the last line and answers the counts, the latency histogram (from each line's
append to its arrival, one monotonic clock), the errors and the sampled followers'
arrivals. Every follower checks every line: each sequence number once, in order.

``python -m benchmarks.followers.child fanout SOCKET`` is the ceiling instead: a minimal
fan-out server (trio, a Unix socket, backlog 4096 as the daemon's). A connection
announces itself with ``A <segment>`` (an appender: what it sends is appended to that
segment's log in memory, each line acknowledged with one byte) or ``F <segment>`` (a
follower: sent that log from the start, then each growth). Each follower has one task
that waits for growth and sends what it has not sent yet, so a busy server coalesces
appends into one send, as the daemon's streams do. No HTTP, store, journal or checksums:
what is left is Python waking a task per follower and a ``send`` per wake-up. It prints
``{"ready": true}`` once it listens and runs until its stdin is closed.
"""

from __future__ import annotations

import gc
import json
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio

from tierfs.contracts.datadir import follow_socket_path
from tierfs.remote.client import TierClient

BUCKET_NS = 100_000  # 0.1 ms
THREAD_STACK_BYTES = 256 << 10  # a follower thread needs little stack; a thousand of them
RECV_BYTES = 1 << 16
BACKLOG = 4096
STREAM_IDLE_S = 300  # the longest the daemon may keep a stream without a byte; runs are shorter


class Follower:
    """One follower's checks; a sampled one keeps each line's arrival ([seq, ns])."""

    def __init__(self, sampled: bool = False) -> None:
        self.arrivals: list[tuple[int, int]] | None = [] if sampled else None
        self.next_seq = self.lines = self.pieces = self.disorder = 0
        self.histogram: Counter[int] = Counter()
        self.error: str | None = None
        self._rest = b""

    def take(self, piece: bytes) -> None:
        now_ns = time.monotonic_ns()
        self.pieces += 1
        lines = (self._rest + piece).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            seq_text, sent_text, _ = line.split(b" ", 2)
            seq = int(seq_text)
            self.disorder += seq != self.next_seq
            self.next_seq, self.lines = seq + 1, self.lines + 1
            if seq > 0:  # line 0 is the warm-up every follower waits for
                self.histogram[(now_ns - int(sent_text)) // BUCKET_NS] += 1
                if self.arrivals is not None:
                    self.arrivals.append((seq, now_ns))

    def guarded(self, follow: Any, *args: Any) -> None:
        try:
            follow(*args)
        except Exception as e:  # counted and reported: the benchmark's "errors"
            self.error = f"{type(e).__name__}: {e}"


def follow_tierfs(client: Any, name: str, follower: Follower) -> None:
    for piece in client.follow(name, 0):
        follower.take(piece)


def follow_reference(path: str, segment_index: int, follower: Follower) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(b"F %d\n" % segment_index)
        while piece := sock.recv(RECV_BYTES):
            follower.take(piece)


def follow_all_trio(request: dict[str, Any], followers: list[Follower]) -> None:
    """A trio task per follower, until the process ends (run it in a daemon thread)."""
    address = request["address"]
    api_socket = Path(address[len("unix://"):])
    path = str(api_socket if request["via"] == "api" else follow_socket_path(api_socket.parent))

    async def received(stream: trio.SocketStream) -> bytes:
        data = await stream.receive_some(RECV_BYTES)
        if not data:
            raise ConnectionError("the daemon closed the stream")
        return data

    async def follow_reference(segment_index: int, follower: Follower) -> None:
        async with await trio.open_unix_socket(address) as stream:
            await stream.send_all(b"F %d\n" % segment_index)
            while piece := await stream.receive_some(RECV_BYTES):
                follower.take(piece)

    async def follow_tierfs(name: str, follower: Follower) -> None:
        import h11

        async with await trio.open_unix_socket(path) as stream:
            connection = h11.Connection(h11.CLIENT)
            target = f"/v1/segments/{quote(name, safe='').replace('.', '%2E')}?follow=1&stream=1&timeout={STREAM_IDLE_S}"
            await stream.send_all(connection.send(h11.Request(method="GET", target=target, headers=[("host", "t")]))
                                  + connection.send(h11.EndOfMessage()))
            while not isinstance(event := connection.next_event(), h11.Response):
                if isinstance(event, h11.ConnectionClosed):
                    raise ConnectionError("the daemon closed the stream before answering")
                if event is h11.NEED_DATA:
                    connection.receive_data(await stream.receive_some(RECV_BYTES))
            if event.status_code != 200:
                raise RuntimeError(f"the daemon answered {event.status_code}")
            buffer = bytearray(connection.trailing_data[0])
            while True:  # chunked: <hex size>\r\n<data>\r\n ... 0\r\n\r\n
                while (line_end := buffer.find(b"\r\n")) < 0:
                    buffer += await received(stream)
                size = int(buffer[:line_end], 16)
                if size == 0:
                    raise ConnectionError("the stream ended")  # followers expect lines until the run ends
                while len(buffer) < line_end + 4 + size:
                    buffer += await received(stream)
                follower.take(bytes(buffer[line_end + 2:line_end + 2 + size]))
                del buffer[:line_end + 4 + size]

    async def guarded(follower: Follower, follow: Any, *args: Any) -> None:
        try:
            await follow(*args, follower)
        except Exception as e:  # counted and reported: the benchmark's "errors"
            follower.error = f"{type(e).__name__}: {e}"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for index, follower in zip(request["followers"], followers, strict=True):
                if request["source"] == "tierfs":
                    nursery.start_soon(guarded, follower, follow_tierfs, request["segments"][index])
                else:
                    nursery.start_soon(guarded, follower, follow_reference, index)

    trio.run(main)


def wait_until(followers: list[Follower], seq: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s and not all(f.next_seq > seq or f.error for f in followers):
        time.sleep(0.05)
    return time.monotonic() - started


def errors_of(followers: list[Follower]) -> dict[str, int]:
    return dict(Counter(f.error.split(" at ")[0] for f in followers if f.error))  # without the socket path


class Log:
    def __init__(self) -> None:
        self.data = bytearray()
        self.grew = trio.Event()

    def append(self, piece: bytes) -> None:
        self.data += piece
        self.grew.set()
        self.grew = trio.Event()


async def serve_connection(stream: trio.SocketStream, logs: dict[int, Log]) -> None:
    announced = b""
    while not announced.endswith(b"\n"):
        piece = await stream.receive_some(1)
        if not piece:
            return
        announced += piece
    kind, index_text = announced.split()
    log = logs.setdefault(int(index_text), Log())
    if kind == b"A":
        while piece := await stream.receive_some(RECV_BYTES):
            log.append(piece)
            await stream.send_all(b"+" * piece.count(b"\n"))  # one acknowledgement per line
        return
    sent = 0
    try:
        while True:
            while sent == len(log.data):
                await log.grew.wait()
            end = len(log.data)
            await stream.send_all(bytes(log.data[sent:end]))
            sent = end
    except trio.BrokenResourceError:
        return


async def fanout(path: str) -> None:
    logs: dict[int, Log] = {}
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(BACKLOG)
    print('{"ready": true}', flush=True)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await serve_connection(stream, logs)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, [trio.SocketListener(sock)])
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # until the parent closes it
        nursery.cancel_scope.cancel()


def main() -> int:
    request = json.loads(sys.stdin.readline())
    threading.stack_size(THREAD_STACK_BYTES)
    followers = [Follower(i % request["sample_every"] == 0) for i in range(len(request["followers"]))]
    if request["clients"] == "trio":
        threads = [threading.Thread(target=follow_all_trio, args=(request, followers), daemon=True)]
    elif request["source"] == "tierfs":
        client = TierClient(request["address"])
        threads = [threading.Thread(target=f.guarded, args=(follow_tierfs, client, request["segments"][index], f),
                                    daemon=True) for index, f in zip(request["followers"], followers, strict=True)]
    else:
        threads = [threading.Thread(target=f.guarded, args=(follow_reference, request["address"], index, f), daemon=True)
                   for index, f in zip(request["followers"], followers, strict=True)]
    gc.collect()  # the set-up stays out of the collector's full passes (pauses of 15-40 ms every
    gc.freeze()  # follower of the process would wait out), and young objects are collected
    gc.set_threshold(50_000, 20, 100)  # rarely, as in the daemon
    for thread in threads:
        thread.start()
    waited_s = wait_until(followers, 0, request["ready_timeout_s"])
    ready = sum(f.next_seq > 0 for f in followers)
    print(json.dumps({"ready": ready, "waited_s": waited_s, "errors": errors_of(followers)}), flush=True)
    line = sys.stdin.readline()
    if not line:
        return 0
    finish = json.loads(line)
    waited_s = wait_until(followers, finish["last_seq"], finish["deadline_s"])
    histogram: Counter[int] = Counter()
    for f in followers:
        histogram.update(f.histogram)
    print(json.dumps({
        "followers": len(followers), "lines": sum(f.lines for f in followers),
        "complete": sum(f.lines == finish["last_seq"] + 1 and not f.disorder and f.error is None for f in followers),
        "pieces": sum(f.pieces for f in followers), "disorder": sum(f.disorder for f in followers),
        "errors": errors_of(followers), "histogram": {str(b): n for b, n in histogram.items()}, "drain_s": waited_s,
        "samples": [[segment, seq, arrived_ns] for segment, f in zip(request["followers"], followers, strict=True)
                    if f.arrivals is not None for seq, arrived_ns in f.arrivals]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(fanout, sys.argv[2]) if sys.argv[1:2] == ["fanout"] else main())
