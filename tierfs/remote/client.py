"""Client of the daemon's HTTP API: a blocking ``TierClient`` (fsspec, Spark workers;
``remote_store.RemoteStore`` wraps it for the CLI).

Discovery: ``TIERFS_URL`` (``unix:///path/tierfs.sock`` or ``http://host:port`` with
``TIERFS_TOKEN``), else the socket in ``TIERFS_DATA_DIR`` or the default data dir.

Invariants:
- A non-2xx response becomes the same ``TierFSError`` subclass the daemon raised, with
  its message and facts (``error_wire.rebuild_error``): callers cannot tell local from remote.
- A daemon that cannot be reached is ``DaemonUnavailableError``, never a raw httpx error;
  a request that was sent and got no answer is its subclass ``ResponseLostError``
  (it may have taken effect). A daemon that is running but does not accept the
  connection (a full accept queue) is retried with backoff, then reported as its
  subclass ``DaemonOverloadedError`` ("daemon overloaded"), never as "no daemon"
  (``connect_retry``).
- ``append`` is one request through the API; a writer of many appends pipelines them
  on the daemon's append socket (``append_pipeline``, through ``append_socket`` and
  ``connect_appends``).
- ``follow`` is one streamed response per follower (on the daemon's follow socket when
  it has one), reopened at the offset reached when it ends: every durable byte once,
  in order, of the segment it first opened.
- Tokens go only into the Authorization header, never into URLs or logs.
- Names are sent exactly as given (``_path``): the engine alone judges them.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import httpx

from tierfs.contracts import operations as ops
from tierfs.contracts.datadir import (
    APPEND_SOCKET_NAME,
    FOLLOW_SOCKET_NAME,
    default_data_dir,
    socket_path,
)
from tierfs.contracts.error_wire import rebuild_error
from tierfs.contracts.errors import (
    DaemonOverloadedError,
    DaemonUnavailableError,
    InvalidArgumentError,
    ResponseLostError,
    TierFSError,
)
from tierfs.contracts.operations import FORWARDED_HEADER, HOST_HEADER, Operation
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.contracts.writers import WriterSeq
from tierfs.remote.append_connection import AnswerLost, AppendConnection
from tierfs.remote.connect_retry import OVERLOAD_RETRY_S, ConnectBackoff, refused_by_live_daemon
from tierfs.remote.follow_reader import FollowStream, StreamCut, open_follow

T = TypeVar("T")
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # per answer; "unbounded" operations (fsck, flush) wait without it, follow polls add their own
# Connections kept open for reuse; any number may be open at once (threads sharing one
# client each hold one while a request or a follow is under way).
KEEPALIVE_CONNECTIONS = 32
FOLLOW_IDLE_S = 30.0  # the daemon ends a stream idle this long; the client reopens it
FOLLOW_BROKEN_REOPENS = 3  # streams cut short in a row without a byte before follow gives up


# what to do when no daemon answers: every front end (CLI, fsspec, Spark) shows this
NO_DAEMON_HINT = (" (start one: tierfs serve, or tierfs mount DIR; or point TIERFS_URL or TIERFS_DATA_DIR "
                  "at a running one)")


def discover_url(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The daemon URL to use: explicit data dir > TIERFS_URL > TIERFS_DATA_DIR > default."""
    if data_dir is None and os.environ.get("TIERFS_URL"):
        return os.environ["TIERFS_URL"]
    directory = Path(data_dir or os.environ.get("TIERFS_DATA_DIR") or default_data_dir())
    return f"unix://{socket_path(directory.expanduser())}"


class TierClient:
    """Blocking client; safe to share between threads (httpx.Client is)."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 forwarded_container: int | None = None, host_id: str | None = None, ca_path: str = "",
                 read_timeout_s: float = READ_TIMEOUT_S, overload_retry_s: float = OVERLOAD_RETRY_S) -> None:
        """``forwarded_container``: a cluster daemon passing calls for that container on
        to its owner (which serves them from that container only, or answers
        ``not_owner``; never forwards them again). ``host_id``: the calling cluster
        daemon's id, ``token`` then its own (``cluster.host_credentials``). ``ca_path``:
        the CA an https:// daemon's certificate is checked against (default
        ``TIERFS_CA``, else the system's). ``overload_retry_s``: how long a daemon that
        does not accept connections is retried before ``DaemonOverloadedError``."""
        self.url = url or discover_url()
        if not self.url.startswith(("unix://", "http://", "https://")):
            hint = f"http://{self.url}" if ":" in self.url and "/" not in self.url else "unix:///path/to/tierfs.sock"
            raise InvalidArgumentError(f"daemon URL {self.url!r} has no scheme: did you mean {hint}?")
        token = token or os.environ.get("TIERFS_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if forwarded_container is not None:
            headers[FORWARDED_HEADER] = str(forwarded_container)
        if host_id is not None:
            headers[HOST_HEADER] = host_id
        self.read_timeout_s = read_timeout_s
        self.overload_retry_s = overload_retry_s
        timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS)
        self._headers = headers
        self._append_connections = threading.local()  # append_on_socket's, one per thread
        # Only an https:// daemon needs certificates (one context per CA file in a
        # process, tls.client_context: Spark makes a client per partition).
        verify: bool | ssl.SSLContext = False
        if self.url.startswith("https://"):
            from tierfs.remote.tls import client_context

            verify = client_context(ca_path)
        if self.url.startswith("unix://"):
            transport = httpx.HTTPTransport(uds=self.url[len("unix://"):], limits=limits, verify=verify)
            self._http = httpx.Client(
                transport=transport, base_url="http://tierfs", headers=headers, timeout=timeout
            )
        else:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, limits=limits,
                                      verify=verify)

    def close(self) -> None:
        """Closes the HTTP client and the calling thread's append connection."""
        self.close_append_connection()
        self._http.close()

    def close_append_connection(self) -> None:
        """Close the calling thread's ``append_on_socket`` connection, if any (a thread
        that used it calls this before it ends)."""
        connection = getattr(self._append_connections, "connection", None)
        if connection is not None:
            connection.close()
            self._append_connections.connection = None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._checked(self._send(self._http.build_request(method, path, **kwargs)))

    def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """``request``'s response; a daemon that does not accept the connection is
        retried with backoff (nothing was sent), then ``DaemonOverloadedError``."""
        try:
            return self._connecting(self.url, lambda: self._http.send(request, stream=stream))
        except httpx.PoolTimeout as e:
            raise DaemonUnavailableError(f"no connection to the tierfs daemon at {self.url}: {e}{NO_DAEMON_HINT}") from None
        except httpx.TransportError as e:  # sent (maybe in part), then no answer
            raise ResponseLostError(f"no answer from the tierfs daemon at {self.url}: {e!r}") from None

    def _connecting(self, url: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, retried with backoff while the daemon at ``url`` is running
        but refuses the connection; ``DaemonUnavailableError`` when none runs there."""
        backoff = ConnectBackoff(self.overload_retry_s)
        while True:
            try:
                return attempt()
            except StreamCut:  # connected: not a question of reaching the daemon
                raise
            except (httpx.ConnectError, httpx.ConnectTimeout, OSError) as e:
                if not refused_by_live_daemon(url, e):
                    raise DaemonUnavailableError(f"no tierfs daemon at {url}: {e}{NO_DAEMON_HINT}") from None
                if not backoff.wait():
                    raise DaemonOverloadedError(
                        f"tierfs daemon overloaded at {url}: it is running but accepted no connection "
                        f"in {backoff.attempts} attempts over {backoff.elapsed_s:.1f} s ({e})") from None

    def _checked(self, response: httpx.Response) -> httpx.Response:
        """``response`` if it is a success, else the daemon's error raised."""
        if response.status_code < 400:
            return response
        try:
            body = response.read()
        except httpx.TransportError as e:
            raise ResponseLostError(f"no answer from the tierfs daemon at {self.url}: {e!r}") from None
        finally:
            response.close()
        raise self._error(response.status_code, body)

    def _error(self, status: int, body: bytes) -> TierFSError:
        """The daemon's error from an error answer's status and JSON body."""
        try:
            error = json.loads(body)["error"]
            return rebuild_error(error["code"], error["message"], error.get("details"))
        except (ValueError, KeyError, TypeError):
            return TierFSError(f"HTTP {status} from {self.url}: {body[:200].decode(errors='replace')}")

    @staticmethod
    def _path(name: str) -> str:
        """``name`` as one URL path segment: every '/' and '.' percent-encoded too, so
        no URL normalisation on the way ('..', '.', '//', a trailing '/') can change
        it; the daemon decodes it back and the engine checks it as given."""
        return quote(name, safe="").replace(".", "%2E")

    # --------------------------------------------------------------- namespace
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/v1/health").json()
        return result

    def metrics(self) -> dict[str, float]:
        """The daemon's Prometheus metrics as {sample name: value} (unlabelled samples)."""
        values = {}
        for line in self._request("GET", "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def stat(self, name: str) -> Info:
        return self.call(ops.STAT, name)

    def ls(self, name: str = "") -> list[Info]:
        return self.call(ops.LS, name)

    def layout(self, name: str) -> list[dict[str, Any]]:
        return self.call(ops.LAYOUT, name)

    def create(self, name: str, durability: str | None = None, parents: bool = False) -> SegmentInfo:
        return self.call(ops.CREATE, name, durability=durability, make_parents=parents)

    def delete(self, name: str) -> None:
        self.call(ops.DELETE, name)

    def op(self, operation: str, **args: Any) -> Any:
        """``POST /v1/op/{operation}`` with ``args`` as the JSON body; the JSON answer."""
        return self._request("POST", f"/v1/op/{operation}", json=args).json()

    def call(self, operation: Operation[T], *args: Any, **kwargs: Any) -> T:
        """``operation``'s API method, called with the API's arguments and result
        (``contracts.operations`` encodes them): at its REST route where it has one,
        else ``POST /v1/op``; an ``unbounded`` one without a read timeout."""
        body = operation.body_of(args, kwargs)
        if operation.rest is not None:
            path = self._path(body.pop("path", ""))
            query = {key: ("1" if value else "0") if isinstance(value, bool) else str(value)
                     for key, value in body.items() if value is not None}
            answer = self._request(operation.rest.method, f"{operation.rest.prefix}/{path}", params=query)
            return operation.result.decode(answer.json() if answer.content else None)
        if not operation.unbounded:
            return operation.result.decode(self.op(operation.name, **body))
        unbounded = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        answer = self._request("POST", f"/v1/op/{operation.name}", json=body, timeout=unbounded)
        return operation.result.decode(answer.json())

    # --------------------------------------------------------------- data
    def append(self, name: str, data: bytes | Iterable[bytes], expected_offset: int | None = None,
               *, length: int | None = None, writer: WriterSeq | None = None) -> int:
        """One append request: ``data`` is bytes, or pieces streamed as the body
        (``length`` bytes in all). No retry: ``exactly_once`` retries safely."""
        params = {} if expected_offset is None else {"expected_offset": str(expected_offset)}
        if writer is not None:
            params.update(writer.query())
        headers = {} if length is None else {"Content-Length": str(length)}
        response = self._request("POST", f"/v1/segments/{self._path(name)}", content=data,
                                 params=params, headers=headers)
        return int(response.json()["offset"])

    def append_on_socket(self, name: str, data: bytes, writer: WriterSeq | None = None) -> int:
        """One append, as ``append``, over the daemon's append socket when it serves one
        (no HTTP framework on either side: a fraction of the daemon's CPU per byte),
        else through the API. One connection per calling thread, kept for its next
        appends. No retry: a lost answer raises ``ResponseLostError`` (it may have
        landed), an error answer the daemon's error (the daemon then closed the
        connection; the next call opens another)."""
        path = self.append_socket()
        if path is None:
            return self.append(name, data, writer=writer)
        connection: AppendConnection | None = getattr(self._append_connections, "connection", None)
        if connection is None or not connection.reusable():
            if connection is not None:
                connection.close()
            connection = self._append_connections.connection = self.connect_appends(path)
        try:
            query = "" if writer is None else f"?writer={writer.writer_hex}&writer_seq={writer.seq}"
            connection.send(f"/v1/segments/{self._path(name)}{query}", data)
            status, body = connection.answer()
        except AnswerLost as e:
            connection.close()
            self._append_connections.connection = None
            raise ResponseLostError(f"no answer from the tierfs daemon at {path}: {e!r}") from None
        if status >= 300:
            connection.close()
            self._append_connections.connection = None
            raise self.answer_error(status, body)
        return int(json.loads(body)["offset"])

    def append_socket(self) -> str | None:
        """The daemon's append socket (pipelined appends) when it serves one beside its
        API socket; None over TCP or for a daemon without one."""
        if not self.url.startswith("unix://"):
            return None
        path = str(Path(self.url[len("unix://"):]).with_name(APPEND_SOCKET_NAME))
        return path if os.path.exists(path) else None

    def connect_appends(self, path: str) -> AppendConnection:
        """A connection to the append socket ``path``, retried with backoff while the
        daemon is running but does not accept it (``DaemonOverloadedError`` at last);
        ``DaemonUnavailableError`` when no daemon listens there."""
        return self._connecting(f"unix://{path}", lambda: AppendConnection(path, CONNECT_TIMEOUT_S, self.read_timeout_s))

    def answer_error(self, status: int, body: bytes) -> TierFSError:
        """The daemon's error from an error answer read off a raw connection."""
        return self._error(status, body)

    def read(self, name: str, start: int = 0, end: int | None = None, unconfirmed: bool = False,
             segment_id: int | None = None) -> bytes:
        """Bytes [start, end) (end None: to the durable end); b'' at or past the end.
        With ``segment_id`` only that segment's bytes: if the name now holds another
        (deleted, replaced by a rename) the read fails with ``SegmentNotFoundError``."""
        if end is not None and end <= start:
            return b""
        headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        if segment_id is not None:
            headers["If-Match"] = f'"{segment_id}"'
        params = {"unconfirmed": "1"} if unconfirmed else {}
        try:
            response = self._request("GET", f"/v1/segments/{self._path(name)}", headers=headers, params=params)
        except TierFSError as e:
            if e.code == "out_of_range":
                return b""
            raise
        return response.content

    def follow_once(self, name: str, offset: int, timeout_s: float, max_bytes: int = 4 << 20) -> tuple[bytes, int]:
        """Long-poll: bytes from ``offset`` once some are durable (or b'' at the timeout),
        and the durable length."""
        params = {"follow": "1", "offset": str(offset), "timeout": str(timeout_s), "max_bytes": str(max_bytes)}
        response = self._request(
            "GET", f"/v1/segments/{self._path(name)}", params=params,
            timeout=httpx.Timeout(timeout_s + self.read_timeout_s, connect=CONNECT_TIMEOUT_S),
        )
        return response.content, int(response.headers["X-Tierfs-Durable-Length"])

    def follow(self, name: str, offset: int = 0, poll_timeout_s: float = FOLLOW_IDLE_S) -> Iterator[bytes]:
        """Yield the segment's durable bytes from ``offset`` as they arrive, forever
        (tail -f): one streamed response (``?follow=1&stream=1``) the daemon writes to
        as the segment grows, read from its follow socket when it serves one beside
        its API socket (``follow_reader``), else from the API. When it ends (idle for
        ``poll_timeout_s``, the daemon stopping, a connection cut) it is reopened at
        the offset reached, for the same segment only (If-Match): the reopening raises
        ``SegmentNotFoundError`` once the segment is deleted or its name holds another,
        ``DaemonUnavailableError`` once the daemon is gone."""
        segment_id: int | None = None
        broken_in_a_row = 0
        while True:
            query = urlencode({"follow": "1", "stream": "1", "offset": str(offset), "timeout": str(poll_timeout_s)})
            headers = [] if segment_id is None else [("If-Match", f'"{segment_id}"')]
            stream = self._open_stream(f"/v1/segments/{self._path(name)}?{query}", headers,
                                       poll_timeout_s + self.read_timeout_s)
            delivered = False
            try:
                segment_id = int(stream.headers["etag"].strip('"'))
                for piece in stream.pieces():
                    if piece:
                        offset += len(piece)
                        delivered = True
                        yield piece
                broken_in_a_row = 0
            except StreamCut as e:  # reopened where it stopped
                broken_in_a_row = 0 if delivered else broken_in_a_row + 1
                if broken_in_a_row >= FOLLOW_BROKEN_REOPENS:
                    raise ResponseLostError(f"the follow stream of {name!r} from the tierfs daemon at {self.url} "
                                            f"broke {broken_in_a_row} times in a row: {e}") from None
                if not delivered:  # the daemon may be unable to read there: its error, if so
                    self.read(name, offset, offset + 1, segment_id=segment_id)
            finally:
                stream.close()

    def _open_stream(self, target: str, headers: list[tuple[str, str]], read_timeout_s: float
                     ) -> FollowStream | _HttpxStream:
        """A streamed GET whose head was a success: on the daemon's follow socket when
        it serves one beside its API socket, else through the API."""
        if self.url.startswith("unix://"):
            path = str(Path(self.url[len("unix://"):]).with_name(FOLLOW_SOCKET_NAME))
            if os.path.exists(path):
                url = f"unix://{path}"
                all_headers = [*self._headers.items(), *headers]
                try:
                    stream = self._connecting(url, lambda: open_follow(
                        path, target, all_headers, CONNECT_TIMEOUT_S, read_timeout_s))
                except StreamCut as e:
                    raise ResponseLostError(f"no answer from the tierfs daemon at {url}: {e}") from None
                if stream.status_code >= 400:
                    try:
                        raise self._error(stream.status_code, stream.read())
                    finally:
                        stream.close()
                return stream
        timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
        request = self._http.build_request("GET", target, headers=headers, timeout=timeout)
        return _HttpxStream(self._checked(self._send(request, stream=True)))


class _HttpxStream:
    """A streamed response of the API read through httpx, as ``FollowStream``."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers = {name.lower(): value for name, value in response.headers.items()}

    def pieces(self) -> Iterator[bytes]:
        try:
            yield from self._response.iter_raw()
        except httpx.TransportError as e:
            raise StreamCut(f"the stream's connection broke: {e!r}") from None

    def close(self) -> None:
        self._response.close()


def connect_if_serving(data_dir: Path, *, overload_retry_s: float = OVERLOAD_RETRY_S) -> TierClient | None:
    """A client of the daemon serving ``data_dir``, or None when none answers
    (``DaemonOverloadedError`` when one runs but accepts no connection)."""
    sock = socket_path(data_dir)
    if not sock.exists():
        return None
    client = TierClient(f"unix://{sock}", overload_retry_s=overload_retry_s)
    try:
        client.health()
    except DaemonOverloadedError:  # running: falling back to an in-process store would fail
        client.close()
        raise
    except DaemonUnavailableError:
        client.close()
        return None
    return client
