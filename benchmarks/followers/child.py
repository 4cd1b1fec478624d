"""A follower process of the ``followers`` benchmark: ``python -m benchmarks.followers.child``
(JSON lines on stdin and stdout, ``harness.child``).

Request 1: ``{"source": "tierfs" | "reference", "address", "segments", "followers"
(the segment index of each), "ready_timeout_s", "sample_every", "clients": "threads" |
"trio", "via": "follow" | "api"}``. With ``threads`` a thread per follower: for tierfs
``TierClient.follow(segment, 0)`` on one shared client (as an fsspec filesystem is shared
in a process); for the reference a Unix socket to ``fanout.py`` announcing the segment.
With ``trio`` one thread runs a trio task per follower, which speaks the streamed follow
itself (h11 for the response head, the chunked body by hand) on the daemon's follow
socket or its API socket: a thousand threads on 2 cores put a thousand wake-ups in the
run queue every few appends, and every process (the daemon too) waits behind them.
Answer: ``{"ready", "waited_s", "errors"}`` once every follower has line 0.

Request 2: ``{"last_seq", "deadline_s"}``: wait until every follower has that line,
then answer the counts, the latency histogram (``BUCKET_NS`` buckets, from each line's
append to its arrival, one monotonic clock for the machine), the errors, and the arrival
of each line at every ``sample_every``-th follower (the parent measures from the append's
acknowledgement). Every follower checks every line: each sequence number exactly once,
in order.
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

BUCKET_NS = 100_000  # 0.1 ms
THREAD_STACK_BYTES = 256 << 10  # a follower thread needs little stack; a thousand of them
RECV_BYTES = 1 << 16
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
    import trio

    from tierfs.contracts.datadir import follow_socket_path

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


def answer(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main() -> int:
    request = json.loads(sys.stdin.readline())
    threading.stack_size(THREAD_STACK_BYTES)
    followers = [Follower(i % request["sample_every"] == 0) for i in range(len(request["followers"]))]
    if request["clients"] == "trio":
        threads = [threading.Thread(target=follow_all_trio, args=(request, followers), daemon=True)]
    elif request["source"] == "tierfs":
        from tierfs.remote.client import TierClient

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
    answer({"ready": sum(f.next_seq > 0 for f in followers), "waited_s": waited_s, "errors": errors_of(followers)})
    line = sys.stdin.readline()
    if not line:
        return 0
    finish = json.loads(line)
    waited_s = wait_until(followers, finish["last_seq"], finish["deadline_s"])
    histogram: Counter[int] = Counter()
    for f in followers:
        histogram.update(f.histogram)
    answer({"followers": len(followers), "lines": sum(f.lines for f in followers),
            "complete": sum(f.lines == finish["last_seq"] + 1 and not f.disorder and f.error is None for f in followers),
            "pieces": sum(f.pieces for f in followers), "disorder": sum(f.disorder for f in followers),
            "errors": errors_of(followers), "histogram": {str(b): n for b, n in histogram.items()}, "drain_s": waited_s,
            "samples": [[segment, seq, arrived_ns] for segment, f in zip(request["followers"], followers, strict=True)
                        if f.arrivals is not None for seq, arrived_ns in f.arrivals]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
