"""A fault-injecting proxy for tests: a Unix socket in front of a daemon's that forwards
every byte both ways, except that it swallows the answer to the next ``drops`` appends
(``POST /v1/segments/...``) and closes that connection instead. The daemon did commit
each of those appends; the client only learns that its answer was lost — the case where
a blind retry would land the bytes twice.

Invariants:
- An answer is dropped only once the daemon has started sending it, i.e. after the
  append was committed; requests are never altered.
- ``UnixSocketProxy`` is the forwarding part (also for tests' own proxies). One thread per
  direction per connection; ``close`` stops accepting (connections in
  flight end with their peers).
"""

from __future__ import annotations

import abc
import re
import socket
import threading
from pathlib import Path
from typing import Any, Self

_REQUEST_LINE = re.compile(rb"^([A-Z]+) (/\S*) HTTP/1\.[01]\r\n")
RECV_BYTES = 1 << 16


class UnixSocketProxy(abc.ABC):
    """A Unix socket at ``listen_path`` in front of ``target_path``: each connection
    gets an upstream connection and two threads, ``_requests`` (client to daemon) and
    ``_answers`` (daemon to client), which subclasses define; ``_connection_state``
    gives both threads of one connection what they share."""

    def __init__(self, listen_path: Path, target_path: Path) -> None:
        self.listen_path = listen_path
        self.target_path = target_path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(listen_path))
        self._listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(str(self.target_path))
            state = self._connection_state()
            threading.Thread(target=self._requests, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client, state), daemon=True).start()

    def _connection_state(self) -> Any:
        return None

    def _requests(self, client: socket.socket, upstream: socket.socket, state: Any) -> None:
        """Every request byte, unchanged."""
        try:
            while data := client.recv(RECV_BYTES):
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            shut(upstream)

    @abc.abstractmethod
    def _answers(self, upstream: socket.socket, client: socket.socket, state: Any) -> None:
        """Carry the daemon's answers to the client (what each proxy does to them)."""


class AnswerDroppingProxy(UnixSocketProxy):
    def __init__(self, listen_path: Path, target_path: Path, drops: int = 1) -> None:
        self.drops = drops
        self.dropped = 0
        self._lock = threading.Lock()
        super().__init__(listen_path, target_path)

    def _connection_state(self) -> list[bytes]:
        return [b""]  # the last request line seen on the connection

    def _requests(self, client: socket.socket, upstream: socket.socket, last_request: list[bytes]) -> None:
        try:
            while data := client.recv(RECV_BYTES):
                match = _REQUEST_LINE.match(data)
                if match:
                    last_request[0] = match.group(1) + b" " + match.group(2)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            shut(upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, last_request: list[bytes]) -> None:
        try:
            while data := upstream.recv(RECV_BYTES):
                if last_request[0].startswith(b"POST /v1/segments/") and self._take_drop():
                    break  # committed, but the client never hears it
                client.sendall(data)
        except OSError:
            pass
        finally:  # shutdown, not just close: the other thread is blocked in recv
            close_both(client, upstream)

    def _take_drop(self) -> bool:
        with self._lock:
            if self.dropped >= self.drops:
                return False
            self.dropped += 1
            return True


def shut(sock: socket.socket, how: int = socket.SHUT_WR) -> None:
    """``shutdown`` that ignores a socket already gone."""
    try:
        sock.shutdown(how)
    except OSError:
        pass


def close_both(*socks: socket.socket) -> None:
    """Shut down (waking a thread blocked in ``recv`` on it) and close each socket."""
    for sock in socks:
        shut(sock, socket.SHUT_RDWR)
        sock.close()
