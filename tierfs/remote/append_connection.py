"""One connection to the daemon's append socket (``tierfs-append.sock``): requests
sent back to back, answers read in the same order (HTTP/1.1 pipelining).

Why not httpx: it sends one request at a time and waits for its answer, so the disk
and the socket take turns (the daemon receives the next body only once the previous
append is durable); and it sends a body in 64 KiB writes. Here a request is its head
and its body in one ``sendmsg`` of a blocking socket whose send buffer holds
``SEND_BUFFER_BYTES``, and the caller decides how many requests are in flight.

Invariants:
- A connection that cannot be made raises the ``OSError`` (the caller tells a missing
  daemon from a busy one). Once connected, anything that breaks the connection or a
  malformed answer raises ``AnswerLost``: requests sent and not answered may or may not
  have been executed.
- Answers are read in the order the requests were sent; an error answer is returned as
  its status and body, and the daemon has then closed the connection (nothing sent after
  that request was executed).
- Answers are small JSON documents: one larger than ``ANSWER_MAX_BYTES`` is refused.
"""

from __future__ import annotations

import socket
import struct

SEND_BUFFER_BYTES = 4 << 20  # the daemon takes a body in a few reads (the kernel caps it: net.core.wmem_max)
RECV_BYTES = 1 << 16
ANSWER_MAX_BYTES = 1 << 20  # an answer is a small JSON document
HEAD_MAX_BYTES = 16 << 10


class AnswerLost(ConnectionError):
    """The connection broke (or timed out) before an answer was read whole."""


class AppendConnection:
    """A blocking Unix-socket connection to the append socket at ``path``."""

    def __init__(self, path: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout_s)
            sock.connect(path)
            # a blocking socket with kernel timeouts (Python's own poll before every call)
            sock.settimeout(None)
            timeval = struct.pack("ll", int(read_timeout_s), int(read_timeout_s % 1 * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._received = bytearray()

    def send(self, target: str, body: bytes | bytearray | memoryview) -> None:
        """Send ``POST target`` with ``body``; does not wait for the answer."""
        view = memoryview(body).cast("B")
        head = (f"POST {target} HTTP/1.1\r\nhost: tierfs\r\ncontent-length: {len(view)}\r\n"
                "content-type: application/octet-stream\r\n\r\n").encode("ascii")
        pieces = [memoryview(head), view]
        try:
            while pieces:
                sent = self._sock.sendmsg(pieces)
                while pieces and sent >= len(pieces[0]):
                    sent -= len(pieces[0])
                    pieces.pop(0)
                if pieces and sent:
                    pieces[0] = pieces[0][sent:]
        except OSError as e:  # including the send timeout (EAGAIN) and a daemon that went away
            raise AnswerLost(f"the append's request could not be sent: {e!r}") from None

    def answer(self) -> tuple[int, bytes]:
        """The next answer's status and body."""
        buffer = self._received
        head_end = buffer.find(b"\r\n\r\n")
        while head_end < 0:
            if len(buffer) > HEAD_MAX_BYTES:
                raise AnswerLost("the daemon's answer head is too large")
            self._receive()
            head_end = buffer.find(b"\r\n\r\n")
        lines = bytes(buffer[:head_end]).split(b"\r\n")
        del buffer[:head_end + 4]
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
            raise AnswerLost(f"not an HTTP answer: {lines[0][:80]!r}")
        status = int(status_line[1])
        if status == 100:  # an interim answer (not asked for): the real one follows
            return self.answer()
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
        if length is None or length > ANSWER_MAX_BYTES:
            raise AnswerLost(f"an answer without a usable content-length ({length})")
        while len(buffer) < length:
            self._receive()
        body = bytes(buffer[:length])
        del buffer[:length]
        return status, body

    def _receive(self) -> None:
        try:
            data = self._sock.recv(RECV_BYTES)
        except OSError as e:  # including the read timeout (EAGAIN)
            raise AnswerLost(f"the append's answer did not come: {e!r}") from None
        if not data:
            raise AnswerLost("the daemon closed the connection before answering")
        self._received += data

    def reusable(self) -> bool:
        """True while the daemon keeps the connection open and sent nothing unasked
        (checked before a new run of requests: an idle connection may have been closed)."""
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True  # open, nothing to read: as it should be
        except OSError:
            return False
        return False  # closed (b"") or holding bytes nobody asked for

    def close(self) -> None:
        self._sock.close()
