"""Reading a streamed follow from the daemon's follow socket (``tierfs-follow.sock``):
one blocking Unix socket and h11 per stream, no connection pool.

Why not httpx: a follower receives many small pieces, and httpx spends about 35 us of
Python on each (its stream layers, h11's event machinery, a poll before every read),
twice the follower's own work; with a thousand followers in a few processes that is
most of a core. Here the head is parsed by h11 and each piece costs one ``recv`` (a blocking
socket with kernel timeouts) and a few slices of the chunked framing.

Invariants:
- One connection per stream, closed when the stream ends, breaks, or its caller stops.
- A connection that cannot be made raises the ``OSError`` (the caller tells a missing
  daemon from a busy one); anything that fails after the request was sent, and a body
  cut short, raise ``StreamCut``: the stream is reopened where it stopped.
- A response's status and head are checked by the caller; error bodies are bounded
  (``ERROR_BODY_MAX_BYTES``).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import h11

RECV_BYTES = 1 << 16
ERROR_BODY_MAX_BYTES = 1 << 20  # an error answer is a small JSON document


class StreamCut(ConnectionError):
    """The stream's connection broke (or timed out) before the response ended."""


class FollowStream:
    """One open streamed response: ``status_code``, ``headers`` (lower-case names),
    ``pieces()``; ``close()`` ends it. The head is parsed by h11; the body (chunked, a
    ``Content-Length`` or up to the end of the connection) here, with one ``recv`` and
    a few slices per piece."""

    def __init__(self, sock: socket.socket, response: h11.Response, rest: bytes) -> None:
        self._sock = sock
        self._buffer = bytearray(rest)
        self.status_code = response.status_code
        self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in response.headers}

    def pieces(self) -> Iterator[bytes]:
        """The body's pieces as they arrive, until the response ends."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            yield from self._chunks()
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                piece = bytes(self._buffer[:remaining]) if self._buffer else self._recv(required=True)[:remaining]
                self._buffer.clear()
                remaining -= len(piece)
                yield piece
        else:  # delimited by the end of the connection
            if self._buffer:
                yield bytes(self._buffer)
            while piece := self._recv(required=False):
                yield piece

    def _chunks(self) -> Iterator[bytes]:
        buffer = self._buffer
        while True:
            line_end = buffer.find(b"\r\n")
            while line_end < 0:
                buffer += self._recv(required=True)
                line_end = buffer.find(b"\r\n")
            try:
                size = int(buffer[:line_end].split(b";", 1)[0], 16)
            except ValueError:
                raise StreamCut(f"not a chunk header: {bytes(buffer[:min(line_end, 40)])!r}") from None
            if size == 0:
                return  # the end (no trailers are sent)
            data_end = line_end + 2 + size
            while len(buffer) < data_end + 2:
                buffer += self._recv(required=True)
            if buffer[data_end:data_end + 2] != b"\r\n":
                raise StreamCut("a chunk does not end where its header said")
            piece = bytes(buffer[line_end + 2:data_end])
            del buffer[:data_end + 2]
            yield piece

    def _recv(self, *, required: bool) -> bytes:
        try:
            data = self._sock.recv(RECV_BYTES)
        except OSError as e:  # including the read timeout (EAGAIN)
            raise StreamCut(f"the stream's connection broke: {e!r}") from None
        if not data and required:
            raise StreamCut("the daemon closed the stream's connection before its end")
        return data

    def read(self) -> bytes:
        """The whole (error) body."""
        body = bytearray()
        for piece in self.pieces():
            body += piece
            if len(body) > ERROR_BODY_MAX_BYTES:
                break
        return bytes(body)

    def close(self) -> None:
        self._sock.close()


def open_follow(path: str, target: str, headers: list[tuple[str, str]], connect_timeout_s: float,
                read_timeout_s: float) -> FollowStream:
    """Send ``GET target`` on the Unix socket ``path``; the stream once its head came."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(connect_timeout_s)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    try:
        # a blocking socket with kernel timeouts: one recv per piece (Python's own
        # timeouts poll before every recv)
        sock.settimeout(None)
        timeval = struct.pack("ll", int(read_timeout_s), int(read_timeout_s % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        connection = h11.Connection(h11.CLIENT)
        request = h11.Request(method="GET", target=target, headers=[("host", "tierfs"), *headers])
        try:
            sock.sendall(connection.send(request) + connection.send(h11.EndOfMessage()))
        except OSError as e:
            raise StreamCut(f"the request could not be sent: {e!r}") from None
        return FollowStream(sock, _read_head(sock, connection), connection.trailing_data[0])
    except BaseException:
        sock.close()
        raise


def _read_head(sock: socket.socket, connection: h11.Connection) -> h11.Response:
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise StreamCut("the daemon closed the stream's connection before answering")
            if event is h11.NEED_DATA:
                connection.receive_data(sock.recv(RECV_BYTES))
    except (OSError, h11.ProtocolError) as e:
        if isinstance(e, StreamCut):
            raise
        raise StreamCut(f"the stream's connection broke: {e!r}") from None
