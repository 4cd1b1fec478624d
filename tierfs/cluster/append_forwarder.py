"""Appends forwarded to a container's owner over its TCP append listener: one lean
HTTP/1.1 request per append on a persistent connection, sent and answered on this
daemon's event loop (no worker thread, no HTTP framework on either side).

Why: through the owner's API each forwarded append cost a worker-thread hop, an httpx
request and the owner's hypercorn and Starlette: the forwarding daemon and the owner
together spent twice the CPU of an append made at the owner (0.44-0.51x the owner's
rate on two cores). The owner's append listener is its append socket's server
(``server/append_socket``) on TCP.

Invariants:
- Every request carries this daemon's credentials (``host_credentials``: the owner
  takes it only from a registered daemon) and the container it is forwarded for
  (the owner serves it from that container's store or answers ``not_owner``, never
  forwarding it again), and the append's writer identity: a request whose answer is
  lost is ``ResponseLostError`` and the caller sends the same identity again, so it
  lands once (``engine/segments/writer_marks``).
- A connection carries one request at a time; concurrent appends use several
  connections (each owner's append listener runs one connection's appends in order),
  so the owner commits them together. At most ``IDLE_PER_OWNER`` idle connections are
  kept per owner.
- A connection that was idle may have been closed by its owner meanwhile (a restart):
  when it breaks, the owner's other idle connections are dropped too and the same
  request (same identity, so it lands once) is sent again on a new connection.
- An error answer ends its connection (the owner closes it); it is raised as the
  owner's error.
- A ``tls://`` owner is reached over TLS, its certificate checked against the CA this
  daemon trusts (``tls_ca_path``, else the system's) and the owner's host name.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from typing import Any

import trio

from tierfs.cluster.host_credentials import HostCredential
from tierfs.contracts.error_wire import rebuild_error
from tierfs.contracts.errors import DaemonUnavailableError, ResponseLostError, TierFSError
from tierfs.contracts.operations import FORWARDED_HEADER
from tierfs.contracts.writers import WriterSeq
from tierfs.remote.tls import client_context

IDLE_PER_OWNER = 64
CONNECT_TIMEOUT_S = 5.0
ANSWER_MAX_BYTES = 1 << 20
RECV_BYTES = 1 << 16


class _Stale(Exception):
    """A reused connection ended before any byte of its answer."""


class AppendForwarder:
    """Persistent connections to owners' append listeners (see the module docstring)."""

    def __init__(self, credential: HostCredential, *, read_timeout_s: float, ca_path: str = "") -> None:
        self._credential = credential
        self._read_timeout_s = read_timeout_s
        self._ca_path = ca_path
        self._idle: dict[str, list[trio.abc.Stream]] = {}

    async def append(self, append_url: str, container: int, name: str, data: bytes,
                     expected_offset: int | None, writer: WriterSeq) -> int:
        """``data`` appended to ``name`` at the owner listening at ``append_url``; its offset."""
        query = {} if expected_offset is None else {"expected_offset": str(expected_offset)}
        query.update(writer.query())
        target = f"/v1/segments/{urllib.parse.quote(name, safe='').replace('.', '%2E')}?{urllib.parse.urlencode(query)}"
        head = (f"POST {target} HTTP/1.1\r\nhost: tierfs\r\n{self._credential.header_lines()}"
                f"{FORWARDED_HEADER}: {container}\r\ncontent-length: {len(data)}\r\n\r\n").encode()
        idle = self._idle.setdefault(append_url, [])
        if idle:
            try:
                return await self._exchange(idle.pop(), append_url, head, data, reused=True)
            except _Stale:  # the owner closed it (a restart): its other idle ones too
                for stream in idle:
                    _close_now(stream)
                idle.clear()
        return await self._exchange(await self._connect(append_url), append_url, head, data, reused=False)

    def close(self) -> None:
        for streams in self._idle.values():
            for stream in streams:
                _close_now(stream)
        self._idle.clear()

    async def _connect(self, append_url: str) -> trio.abc.Stream:
        parts = urllib.parse.urlsplit(append_url)
        host = parts.hostname or ""
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                stream = await trio.open_tcp_stream(host, parts.port or 0)
                if parts.scheme != "tls":
                    return stream
                secured = trio.SSLStream(stream, client_context(self._ca_path), server_hostname=host,
                                         https_compatible=True)
                try:
                    await secured.do_handshake()
                except BaseException:
                    _close_now(secured)
                    raise
                return secured
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as e:
            raise DaemonUnavailableError(f"no tierfs daemon at {append_url}: {_reason(e)}") from None

    async def _exchange(self, stream: trio.abc.Stream, append_url: str, head: bytes, data: bytes,
                        *, reused: bool) -> int:
        try:
            with trio.fail_after(self._read_timeout_s):
                await stream.send_all(head + data if len(data) < RECV_BYTES else head)
                if len(data) >= RECV_BYTES:
                    await stream.send_all(data)
                status, body = await _read_answer(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError,
                _AnswerBroken) as e:
            _close_now(stream)
            if reused and not isinstance(e, trio.TooSlowError):
                raise _Stale() from None
            raise ResponseLostError(f"no answer from the tierfs daemon at {append_url}: {e!r}") from None
        if status != 200:
            _close_now(stream)
            raise _error(status, body, append_url)
        idle = self._idle.setdefault(append_url, [])
        if len(idle) < IDLE_PER_OWNER:
            idle.append(stream)
        else:
            _close_now(stream)
        return int(json.loads(body)["offset"])


class _AnswerBroken(Exception):
    pass


def _close_now(stream: trio.abc.Stream) -> None:
    """Close ``stream``'s socket without waiting (a TLS goodbye is not owed to a broken peer)."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        stream.socket.close()


def _reason(error: BaseException) -> str:
    """Why a connection failed, a TLS refusal in the words of its cause."""
    cause = error.__cause__ if isinstance(error, trio.BrokenResourceError) else None
    return f"TLS: {cause}" if isinstance(cause, ssl.SSLError) else repr(error)


async def _read_answer(stream: trio.abc.Stream) -> tuple[int, bytes]:
    """The next answer's status and body; ``_AnswerBroken`` (or the stream's error)
    when it does not come whole."""
    buffer = bytearray()
    while (head_end := buffer.find(b"\r\n\r\n")) < 0:
        piece = await stream.receive_some(RECV_BYTES)
        if not piece:
            raise _AnswerBroken("the daemon closed the connection before answering")
        buffer += piece
        if len(buffer) > ANSWER_MAX_BYTES:
            raise _AnswerBroken("the answer's head is too large")
    lines = bytes(buffer[:head_end]).split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise _AnswerBroken(f"not an HTTP answer: {lines[0][:80]!r}")
    length = next((int(value.strip()) for name, _, value in (line.partition(b":") for line in lines[1:])
                   if name.strip().lower() == b"content-length" and value.strip().isdigit()), None)
    if length is None or length > ANSWER_MAX_BYTES:
        raise _AnswerBroken(f"an answer without a usable content-length ({length})")
    body = buffer[head_end + 4:]
    while len(body) < length:
        piece = await stream.receive_some(RECV_BYTES)
        if not piece:
            raise _AnswerBroken("the daemon closed the connection in the middle of an answer")
        body += piece
    return int(status_line[1]), bytes(body[:length])


def _error(status: int, body: bytes, append_url: str) -> TierFSError:
    try:
        error: dict[str, Any] = json.loads(body)["error"]
        return rebuild_error(error["code"], error["message"], error.get("details"))
    except (ValueError, KeyError, TypeError):
        return TierFSError(f"HTTP {status} from {append_url}: {body[:200].decode(errors='replace')}")
