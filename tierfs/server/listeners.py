"""Listening sockets served by trio until the daemon stops: the daemon's lean sockets
(``stream_socket``: streamed follows; ``append_socket``: pipelined appends), owner-only
Unix sockets, and a cluster daemon's TCP append listener (bound by the daemon), whose
connections may be TLS (``TlsSocket``, with ``server_context``).

Invariants:
- A Unix socket is mode 0600 before it listens (inside the daemon's 0700 data dir), so
  only the daemon's owner can connect; the TCP listener's requests carry credentials
  (checked by its handler, ``server/credentials``).
- Once ``stop`` is set no new connection is accepted; connections still open get
  ``STOP_GRACE_S`` to finish, then are cancelled.
- A TLS connection offers the calls the servers make of a trio socket (``recv``,
  ``recv_into``, ``send``, ``shutdown``, ``close``), so one server serves plain and TLS
  connections alike. Its handshake happens on the first ``recv``; a failed handshake or
  a broken record is an ``OSError``, as a broken socket is. ``shutdown`` and ``close``
  act on the TCP socket underneath (no TLS goodbye is awaited: an answer ends at its
  ``Content-Length``, as in HTTPS). One task receives and one sends at a time, as
  ``trio.SSLStream`` requires (the servers read in one loop and answer in order).
- A daemon's TLS is 1.2 at least, with the certificate chain and key it was given.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from tierfs.contracts.errors import InvalidArgumentError

STOP_GRACE_S = 1.0  # connections still open when the daemon stops are cut after this


async def serve_unix_socket(
    path: Path, backlog: int, stop: trio.Event, handle: Callable[[trio.SocketStream], Awaitable[None]],
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handle`` (one call per connection) on the Unix socket ``path`` until
    ``stop`` is set; started once the socket listens."""
    path.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    await serve_listening_socket(sock, stop, handle, task_status=task_status)


async def serve_listening_socket(
    sock: trio.socket.SocketType, stop: trio.Event, handle: Callable[[trio.SocketStream], Awaitable[None]],
    *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handle`` on ``sock`` (bound and listening) until ``stop`` is set."""
    listener = trio.SocketListener(sock)
    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(partial(trio.serve_listeners, handle, [listener], handler_nursery=connections))
            task_status.started()
            await stop.wait()
            accepting.cancel_scope.cancel()
        connections.cancel_scope.deadline = trio.current_time() + STOP_GRACE_S


def server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A daemon's TLS context: ``cert_path``'s chain and ``key_path``'s key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgumentError(
            f"cannot use the TLS certificate {cert_path!r} with the key {key_path!r}: {e}") from None
    return context


class TlsSocket:
    def __init__(self, sock: trio.socket.SocketType, context: ssl.SSLContext) -> None:
        self._sock = sock
        self._stream = trio.SSLStream(trio.SocketStream(sock), context, server_side=True, https_compatible=True)

    async def _receive(self, size: int) -> bytes | bytearray:
        try:
            return await self._stream.receive_some(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise OSError(f"TLS: {e.__cause__ or e}") from None

    async def recv(self, size: int) -> bytes:
        return bytes(await self._receive(size))

    async def recv_into(self, view: memoryview | bytearray) -> int:
        data = await self._receive(len(view))  # copied once, into the caller's buffer
        view[:len(data)] = data
        return len(data)

    async def send(self, view: memoryview | bytes) -> int:
        try:
            await self._stream.send_all(view)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise OSError(f"TLS: {e.__cause__ or e}") from None
        return len(view)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()
