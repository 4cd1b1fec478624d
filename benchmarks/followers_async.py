"""The ``followers`` benchmark's trio followers (``--clients trio``): one trio loop per
follower process, one task per follower, instead of a thread per follower.

A thousand threads on a 2-core machine put a thousand wake-ups in the kernel's run
queue for every few appends, and every process on the machine (the daemon included)
waits its turn behind them; an async consumer does not. These followers speak the
streamed follow themselves (a Unix socket, h11 for the response head, the chunked body
parsed by hand, as ``tierfs.remote.follow_reader`` does with a blocking socket), on the
daemon's follow socket (or its API socket); for the reference, they read its raw
fan-out. Each follower
checks its lines with the same ``Follower`` as the threads do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import h11
import trio

from tierfs.contracts.datadir import follow_socket_path

RECV_BYTES = 1 << 16
STREAM_IDLE_S = 300  # the longest the daemon may keep a stream without a byte; runs are shorter


def run_followers(source: str, address: str, segments: list[str], assignment: list[int], followers: list[Any],
                  via: str) -> None:
    """Follow until the process ends (run it in a daemon thread); ``via``: the daemon's
    ``follow`` or ``api`` socket."""
    trio.run(_follow_all, source, address, segments, assignment, followers, via)


async def _follow_all(source: str, address: str, segments: list[str], assignment: list[int],
                      followers: list[Any], via: str) -> None:
    api_socket = Path(address[len("unix://"):])
    path = str(api_socket if via == "api" else follow_socket_path(api_socket.parent))
    async with trio.open_nursery() as nursery:
        for index, follower in zip(assignment, followers, strict=True):
            if source == "tierfs":
                nursery.start_soon(_guarded, follower, _follow_tierfs, path, segments[index], follower)
            else:
                nursery.start_soon(_guarded, follower, _follow_reference, address, index, follower)


async def _guarded(follower: Any, follow: Any, *args: Any) -> None:
    try:
        await follow(*args)
    except Exception as e:  # counted and reported: the benchmark's "errors"
        follower.error = f"{type(e).__name__}: {e}"


async def _follow_reference(path: str, segment_index: int, follower: Any) -> None:
    stream = await trio.open_unix_socket(path)
    async with stream:
        await stream.send_all(b"F %d\n" % segment_index)
        while piece := await stream.receive_some(RECV_BYTES):
            follower.take(piece)


async def _follow_tierfs(path: str, name: str, follower: Any) -> None:
    stream = await trio.open_unix_socket(path)
    async with stream:
        connection = h11.Connection(h11.CLIENT)
        target = f"/v1/segments/{quote(name, safe='').replace('.', '%2E')}?follow=1&stream=1&timeout={STREAM_IDLE_S}"
        await stream.send_all(connection.send(h11.Request(method="GET", target=target, headers=[("host", "t")]))
                              + connection.send(h11.EndOfMessage()))
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Response):
                break
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(RECV_BYTES))
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the daemon closed the stream before answering")
        if event.status_code != 200:
            raise RuntimeError(f"the daemon answered {event.status_code}")
        buffer = bytearray(connection.trailing_data[0])
        while True:  # chunked: <hex size>\r\n<data>\r\n ... 0\r\n\r\n
            line_end = buffer.find(b"\r\n")
            while line_end < 0:
                buffer += await _received(stream)
                line_end = buffer.find(b"\r\n")
            size = int(buffer[:line_end], 16)
            if size == 0:
                raise ConnectionError("the stream ended")  # followers expect lines until the run ends
            data_end = line_end + 2 + size
            while len(buffer) < data_end + 2:
                buffer += await _received(stream)
            follower.take(bytes(buffer[line_end + 2:data_end]))
            del buffer[:data_end + 2]


async def _received(stream: trio.SocketStream) -> bytes:
    data = await stream.receive_some(RECV_BYTES)
    if not data:
        raise ConnectionError("the daemon closed the stream")
    return data
