"""A listening socket served by trio until the daemon stops: the daemon's lean sockets
(``stream_socket``: streamed follows; ``append_socket``: pipelined appends), owner-only
Unix sockets, and a cluster daemon's TCP append listener (bound by the daemon).

Invariants:
- A Unix socket is mode 0600 before it listens (inside the daemon's 0700 data dir), so
  only the daemon's owner can connect; the TCP listener's requests carry the bearer
  token (checked by its handler).
- Once ``stop`` is set no new connection is accepted; connections still open get
  ``STOP_GRACE_S`` to finish, then are cancelled.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

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
