"""The ``followers`` benchmark's ceiling: ``python -m benchmarks.followers.fanout SOCKET``,
a minimal fan-out server doing a follower server's essential work and nothing else.

One trio process listening on a Unix socket (backlog ``BACKLOG``, as the daemon). A
connection announces itself with one line: ``A <segment>`` (an appender: everything
it sends next is appended to that segment's log in memory, and each line is
acknowledged with one byte, as an append is answered) or ``F <segment>`` (a
follower: it is sent that log from the start, and then each growth as it happens).
Each follower has one task that waits for growth and sends what it has not sent yet,
so a busy server coalesces several appends into one send, as the daemon's streams do.
No HTTP, no store, no journal, no checksums: what is left is Python waking a task per
follower and a ``send`` per wake-up. It prints ``ready`` once it listens, and runs
until killed.
"""

from __future__ import annotations

import socket
import sys

import trio

BACKLOG = 4096
RECV_BYTES = 1 << 16


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


async def main(path: str) -> None:
    logs: dict[int, Log] = {}
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(BACKLOG)
    listener = trio.SocketListener(sock)
    print("ready", flush=True)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await serve_connection(stream, logs)

    await trio.serve_listeners(handle, [listener])


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
