"""Many followers at once (issue 19, item 8): the streamed follow
(``GET /v1/segments/{path}?follow=1&stream=1``), the client's follow and ``tierfs tail
-f`` on it, and a daemon that does not accept connections reported as overloaded, never
as absent. Real daemons; timings only as generous bounds (speed is the ``followers``
benchmark's job)."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tierfs.contracts import operations as ops
from tierfs.contracts.datadir import LOCK_NAME, follow_socket_path, socket_path
from tierfs.contracts.errors import (
    DaemonOverloadedError,
    DaemonUnavailableError,
    InvalidArgumentError,
    IsADirectoryError_,
    SegmentNotFoundError,
    TruncatedError,
)
from tierfs.remote.client import TierClient, connect_if_serving
from tierfs.remote.follow_reader import open_follow
from tierfs.testing.harness import Daemon, free_port, start_daemon


def record(index: int) -> bytes:
    """Appends of varied sizes, each naming its index (a gap, a repeat or a reordering
    shows)."""
    return b"<%d:" % index + b"x" * (index * 37 % 300) + b">\n"


def collect(client: TierClient, name: str, offset: int, expected_bytes: int, into: list[bytes],
            poll_timeout_s: float = 30.0) -> None:
    """Follow ``name`` from ``offset`` until ``expected_bytes`` have arrived."""
    got = 0
    for piece in client.follow(name, offset, poll_timeout_s=poll_timeout_s):
        into.append(piece)
        got += len(piece)
        if got >= expected_bytes:
            return


def raw_stream(daemon: Daemon, name: str, **params: str) -> tuple[httpx.Client, httpx.Response]:
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://t",
                        timeout=httpx.Timeout(30.0, connect=5.0))
    request = http.build_request("GET", f"/v1/segments/{name}",
                                 params={"follow": "1", "stream": "1", **params})
    return http, http.send(request, stream=True)


def wait_for(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ------------------------------------------------------------------ the stream
def test_every_byte_once_in_order_to_many_followers(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("many/f", parents=True)
    before = b"".join(record(i) for i in range(200))
    client.append("many/f", before)
    records = [record(i) for i in range(200, 1200)]
    total = len(before) + sum(map(len, records))
    received: list[list[bytes]] = [[] for _ in range(12)]
    # from the start (catching up from the store), from the middle, from the end
    offsets = [0] * 4 + [len(before) // 2] * 4 + [len(before)] * 4
    followers = [threading.Thread(target=collect, args=(client, "many/f", offset, total - offset, into))
                 for offset, into in zip(offsets, received, strict=True)]
    for thread in followers:
        thread.start()
    for piece in records:
        client.append("many/f", piece)
    for thread in followers:
        thread.join(timeout=60)
        assert not thread.is_alive()
    whole = before + b"".join(records)
    assert client.read("many/f") == whole
    for offset, into in zip(offsets, received, strict=True):
        assert b"".join(into) == whole[offset:]


def test_a_follower_far_behind_catches_up_then_follows(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("behind")
    history = os.urandom(3 << 20)  # more than a feed's window: read from the store
    for start in range(0, len(history), 1 << 20):
        client.append("behind", history[start:start + (1 << 20)])
    live = b"".join(record(i) for i in range(300))
    into: list[bytes] = []
    follower = threading.Thread(target=collect, args=(client, "behind", 0, len(history) + len(live), into))
    follower.start()
    for i in range(300):
        client.append("behind", record(i))
    follower.join(timeout=60)
    assert b"".join(into) == history + live


def test_a_stream_reopened_at_its_offset_goes_on(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("reopened")
    client.append("reopened", b"first\n")
    stream = client.follow("reopened", 0)
    assert next(stream) == b"first\n"
    client.append("reopened", b"second\n")
    assert next(stream) == b"second\n"
    stream.close()  # the follower goes away; appends go on
    client.append("reopened", b"third\n")
    again = client.follow("reopened", len(b"first\nsecond\n"))
    assert next(again) == b"third\n"
    client.append("reopened", b"fourth\n")
    assert next(again) == b"fourth\n"
    again.close()


def test_an_idle_stream_ends_and_the_client_reopens_it_seamlessly(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("idle")
    http, response = raw_stream(daemon, "idle", timeout="0.5")
    started = time.monotonic()
    assert response.status_code == 200 and response.headers["ETag"]
    assert b"".join(response.iter_raw()) == b""  # no byte for 0.5 s: a clean end
    assert 0.4 < time.monotonic() - started < 10
    http.close()
    into: list[bytes] = []
    expected = b"".join(record(i) for i in range(20))
    follower = threading.Thread(target=collect, args=(client, "idle", 0, len(expected), into, 0.3))
    follower.start()
    for i in range(20):  # pauses longer than the idle time: the stream is reopened between
        client.append("idle", record(i))
        if i % 5 == 4:
            time.sleep(0.8)
    follower.join(timeout=60)
    assert b"".join(into) == expected


def test_the_stream_ends_cleanly_when_the_segment_is_deleted(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("doomed")
    client.append("doomed", b"last words\n")
    http, response = raw_stream(daemon, "doomed")
    pieces = response.iter_raw()
    assert next(pieces) == b"last words\n"
    client.delete("doomed")
    assert b"".join(pieces) == b""  # the chunked body ends properly (no transport error)
    http.close()
    # the client's follow ends with the segment's error, not a hang or a daemon error
    client.create("doomed2")
    stream = client.follow("doomed2", 0)
    client.append("doomed2", b"x")
    assert next(stream) == b"x"
    client.delete("doomed2")
    with pytest.raises(SegmentNotFoundError):
        next(stream)


def test_a_follow_never_crosses_into_a_segment_that_takes_the_name(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("named")
    client.create("other")
    client.append("named", b"mine\n")
    client.append("other", b"not mine\n")
    stream = client.follow("named", 0)
    assert next(stream) == b"mine\n"
    client.call(ops.MV, "other", "named")  # POSIX rename: the name now holds another segment
    with pytest.raises(SegmentNotFoundError):
        next(stream)


def test_following_from_bytes_retention_deleted_is_truncated(tmp_path: Path) -> None:
    """Said before the stream starts (410), not as a stream cut short."""
    config = tmp_path / "tierfs.toml"
    config.write_text("flush_interval_s = 0.05\nflush_bytes = 65536\nmax_chunk_bytes = 262144\n"
                      "max_flush_bytes = 131072\npolicy_interval_s = 0.1\n")
    daemon = start_daemon(tmp_path / "data", config_file=config)
    try:
        client = daemon.client()
        client.create("r/seg", parents=True)
        for _ in range(16):
            client.append("r/seg", os.urandom(64 << 10))
        client.call(ops.FLUSH, "r/seg")
        client.call(ops.POLICY_SET, "r", {"retention_bytes": 300 << 10})
        wait_for(lambda: client.stat("r/seg").start_offset > 0)  # type: ignore[union-attr]
        start = client.stat("r/seg").start_offset  # type: ignore[union-attr]
        with pytest.raises(TruncatedError):
            next(client.follow("r/seg", 0))
        stream = client.follow("r/seg", start)
        assert len(next(stream)) > 0  # from the first byte kept, it streams
        stream.close()
    finally:
        daemon.stop()


def test_stream_requests_are_checked(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("checked")
    client.call(ops.MKDIR, "a-dir")
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://t")
    answer = http.get("/v1/segments/checked", params={"stream": "1"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_argument"
    answer = http.get("/v1/segments/checked", params={"follow": "1", "stream": "1", "unconfirmed": "1"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_argument"
    answer = http.get("/v1/segments/checked", params={"follow": "1", "stream": "1", "timeout": "301"})
    assert answer.status_code == 400
    answer = http.get("/v1/segments/checked", params={"follow": "1", "stream": "1"}, headers={"If-Match": '"999999"'})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    http.close()
    with pytest.raises(IsADirectoryError_):
        next(client.follow("a-dir"))
    with pytest.raises(SegmentNotFoundError):
        next(client.follow("absent"))
    with pytest.raises(InvalidArgumentError):
        client.follow_once("checked", 0, timeout_s=-1)


def test_hundreds_of_followers_connect_at_once(daemon: Daemon) -> None:
    """300 followers in one process, one shared client, all connecting together: the
    issue's [Errno 11] (a full accept queue reported as 'no daemon') must not happen."""
    client = daemon.client()
    client.create("crowd")
    errors: list[BaseException] = []
    got: list[bytes] = []
    start = threading.Event()

    def follow() -> None:
        start.wait()
        try:
            got.append(next(client.follow("crowd", 0)))
        except BaseException as e:  # noqa: BLE001 - counted below
            errors.append(e)

    threads = [threading.Thread(target=follow) for _ in range(300)]
    for thread in threads:
        thread.start()
    start.set()
    client.append("crowd", b"hello, all\n")
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert got == [b"hello, all\n"] * 300


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def peak_rss_reset(pid: int) -> int:
    """Start a new peak (Linux: 5 > /proc/PID/clear_refs); the resident size now."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return peak_rss_bytes(pid)


@pytest.mark.parametrize("socket_name", ["api", "follow"])
def test_stalled_followers_do_not_grow_the_daemons_memory(tmp_path: Path, socket_name: str) -> None:
    """Followers that read nothing while 32 MiB are appended, then all catch up at once,
    hold a piece each, never the growth: the daemon's peak RSS grows about as much as
    for the same appends unfollowed. On the API socket (hypercorn) and on the follow
    socket."""
    daemon = start_daemon(tmp_path / "data")
    try:
        client = daemon.client()
        piece = os.urandom(1 << 20)
        appended_bytes = 32 << 20

        def append_all(name: str) -> None:
            for _ in range(appended_bytes // len(piece)):
                client.append(name, piece)
            client.op("flush")

        for name in ("warm-up", "unfollowed", "followed"):
            client.create(name)
        append_all("warm-up")  # the first appends grow the allocator's pools
        started = peak_rss_reset(daemon.pid)
        append_all("unfollowed")
        unfollowed_growth = peak_rss_bytes(daemon.pid) - started  # the daemon's own, for such appends
        streams = [open_stalled(daemon, socket_name, "followed") for _ in range(8)]
        started = peak_rss_reset(daemon.pid)
        append_all("followed")
        expected = hashlib.sha256(piece * (appended_bytes // len(piece))).hexdigest()
        digests: list[tuple[int, str]] = []

        def catch_up(pieces: Iterator[bytes]) -> None:
            digest, got = hashlib.sha256(), 0
            for data in pieces:
                digest.update(data)
                got += len(data)
                if got >= appended_bytes:
                    break
            digests.append((got, digest.hexdigest()))

        readers = [threading.Thread(target=catch_up, args=(pieces,)) for pieces, _ in streams]
        for reader in readers:  # all at once: each reads the store at its own pace
            reader.start()
        for reader in readers:
            reader.join(timeout=120)
        followed_growth = peak_rss_bytes(daemon.pid) - started
        assert digests == [(appended_bytes, expected)] * 8  # every stalled follower gets every byte
        # buffering the growth per follower would add 8 x 32 MiB
        assert followed_growth < unfollowed_growth + (64 << 20), (followed_growth, unfollowed_growth)
        for _, close in streams:
            close()
    finally:
        daemon.stop()


def open_stalled(daemon: Daemon, socket_name: str, name: str) -> tuple[Iterator[bytes], Callable[[], None]]:
    """A stream opened and not read: its pieces, and how to close it."""
    if socket_name == "api":
        http, response = raw_stream(daemon, name)

        def close_api() -> None:
            response.close()
            http.close()
        return response.iter_raw(), close_api
    stream = open_follow(str(follow_socket_path(daemon.data_dir)), f"/v1/segments/{name}?follow=1&stream=1",
                         [], 5.0, 30.0)
    return stream.pieces(), stream.close


def test_a_follower_of_a_stopped_daemon_hears_no_daemon(tmp_path: Path) -> None:
    """Stopping ends the streams (the daemon exits, no hang) and the reopening finds no
    daemon: 'no tierfs daemon', not 'overloaded'."""
    daemon = start_daemon(tmp_path / "data")
    client = daemon.client()
    client.create("s")
    stream = client.follow("s", 0)
    client.append("s", b"a")
    assert next(stream) == b"a"
    started = time.monotonic()
    code, _ = daemon.stop()
    assert code == 0 and time.monotonic() - started < 10
    with pytest.raises(DaemonUnavailableError) as raised:
        next(stream)
    assert not isinstance(raised.value, DaemonOverloadedError)


# ------------------------------------------------------------------ the follow socket
def exchange(path: Path, request: bytes) -> bytes:
    """Send one raw request; everything the socket answers until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(request)
        answer = b""
        while data := sock.recv(65536):
            answer += data
        return answer


def test_the_follow_socket_answers_as_the_api_and_refuses_the_rest(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("plain")
    client.append("plain", b"0123456789")
    path = follow_socket_path(daemon.data_dir)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # an ordinary ranged read, and the API's errors as JSON
    answer = exchange(path, b"GET /v1/segments/plain HTTP/1.1\r\nHost: t\r\nRange: bytes=2-4\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 206 ") and answer.endswith(b"\r\n\r\n234") and b"connection: close" in answer
    answer = exchange(path, b"GET /v1/segments/absent HTTP/1.1\r\nHost: t\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404 ") and b'"code":"not_found"' in answer
    answer = exchange(path, b"GET /v1/segments/plain?follow=1&stream=1&timeout=x HTTP/1.1\r\nHost: t\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"code":"invalid_argument"' in answer
    # what this socket does not serve
    assert exchange(path, b"POST /v1/segments/plain HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx"
                    ).startswith(b"HTTP/1.1 405 ")
    assert exchange(path, b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert exchange(path, b"GET /v1/segments/plain HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
                    ).startswith(b"HTTP/1.1 400 ")
    assert exchange(path, b"this is not HTTP\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert client.read("plain") == b"0123456789"  # nothing changed


def test_a_raw_http_stream_on_the_follow_socket(daemon: Daemon) -> None:
    """What curl --unix-socket sees: a chunked body (HTTP/1.1), or the bytes until the
    connection closes (HTTP/1.0); both end when the segment is deleted."""
    client = daemon.client()
    path = follow_socket_path(daemon.data_dir)
    for version, name in ((b"1.1", "raw11"), (b"1.0", "raw10")):
        client.create(name)
        client.append(name, b"one\n")
        answers: list[bytes] = []
        request = b"GET /v1/segments/%s?follow=1&stream=1 HTTP/%s\r\nHost: t\r\n\r\n" % (name.encode(), version)
        reader = threading.Thread(target=lambda into=answers, sent=request: into.append(exchange(path, sent)))
        reader.start()
        client.append(name, b"two\n")
        time.sleep(0.3)
        client.delete(name)
        reader.join(timeout=30)
        head, _, body = answers[0].partition(b"\r\n\r\n")
        head = head.lower()
        assert head.startswith(b"http/1.1 200 ok") and b'etag: "' in head
        if version == b"1.1":
            assert b"transfer-encoding: chunked" in head and body.endswith(b"0\r\n\r\n")
            assert b"".join(body.split(b"\r\n")[1::2]) == b"one\ntwo\n"
        else:
            assert b"transfer-encoding" not in head and body == b"one\ntwo\n"


def test_without_the_follow_socket_the_client_streams_through_the_api(tmp_path: Path) -> None:
    """Over TCP (with the token), and on a Unix socket whose daemon serves no follow
    socket, the same streamed follow comes through the API."""
    port = free_port()
    daemon = start_daemon(tmp_path / "data", "--listen", f"127.0.0.1:{port}")
    try:
        token = (tmp_path / "data" / "token").read_text().strip()
        follow_socket_path(daemon.data_dir).unlink()  # as a daemon without one
        for client in (TierClient(f"http://127.0.0.1:{port}", token=token), daemon.client()):
            name = f"via api/{client.url[:4]}.log"  # '/', '.' and ' ' travel as given
            client.create(name, parents=True)
            expected = b"".join(record(i) for i in range(100))
            into: list[bytes] = []
            follower = threading.Thread(target=collect, args=(client, name, 0, len(expected), into))
            follower.start()
            for i in range(100):
                client.append(name, record(i))
            follower.join(timeout=60)
            assert b"".join(into) == expected
            stream = client.follow(name, len(expected))
            client.append(name, b"last\n")
            assert next(stream) == b"last\n"
            client.delete(name)
            with pytest.raises(SegmentNotFoundError):
                next(stream)
            client.close()
    finally:
        daemon.stop()


# ------------------------------------------------------------------ overload
@pytest.fixture
def full_backlog(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A live Unix socket that accepts nothing, with its accept queue full (listen(0)
    takes one pending connection): a connect fails with EAGAIN."""
    path = socket_path(tmp_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    pending = []
    while True:
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(path))
        except BlockingIOError:
            filler.close()
            break
        pending.append(filler)
    yield path, server
    for filler in pending:
        filler.close()
    server.close()


def test_a_full_accept_queue_is_retried_then_daemon_overloaded(full_backlog: tuple[Path, socket.socket]) -> None:
    path, _ = full_backlog
    client = TierClient(f"unix://{path}", overload_retry_s=0.5)
    started = time.monotonic()
    with pytest.raises(DaemonOverloadedError) as raised:
        client.health()
    assert time.monotonic() - started >= 0.5  # retried with backoff for the budget
    assert "daemon overloaded" in str(raised.value) and "no tierfs daemon" not in str(raised.value)
    assert raised.value.code == "daemon_overloaded"
    with pytest.raises(DaemonOverloadedError):  # the CLI's discovery does not fall back in-process
        connect_if_serving(path.parent, overload_retry_s=0.3)


def test_a_queue_that_drains_is_waited_for(full_backlog: tuple[Path, socket.socket]) -> None:
    path, server = full_backlog

    def accept_later() -> None:
        time.sleep(0.3)
        server.accept()[0].close()  # the connection that filled the queue
        connection, _ = server.accept()  # the client's, which retried meanwhile
        with connection:
            connection.recv(65536)
            connection.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n'
                               b'{"ok": true}')
    threading.Thread(target=accept_later, daemon=True).start()
    client = TierClient(f"unix://{path}", overload_retry_s=10)
    assert client.health() == {"ok": True}


def test_refused_by_a_live_daemon_is_overloaded_by_a_dead_one_absent(tmp_path: Path) -> None:
    path = socket_path(tmp_path)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))  # bound, not listening: ECONNREFUSED
    try:
        client = TierClient(f"unix://{path}", overload_retry_s=0.3)
        started = time.monotonic()
        with pytest.raises(DaemonUnavailableError) as raised:  # no lock holder: a stale socket
            client.health()
        assert not isinstance(raised.value, DaemonOverloadedError)
        assert "no tierfs daemon" in str(raised.value) and time.monotonic() - started < 0.3
        (tmp_path / LOCK_NAME).write_text(f"{os.getpid()}\n")  # the owner is running
        with pytest.raises(DaemonOverloadedError):
            client.health()
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        (tmp_path / LOCK_NAME).write_text(f"{dead.pid}\n")  # its owner died (kill -9)
        with pytest.raises(DaemonUnavailableError) as raised:
            client.health()
        assert not isinstance(raised.value, DaemonOverloadedError)
    finally:
        bound.close()


def test_no_socket_is_no_daemon_at_once(tmp_path: Path) -> None:
    client = TierClient(f"unix://{socket_path(tmp_path)}", overload_retry_s=5)
    started = time.monotonic()
    with pytest.raises(DaemonUnavailableError) as raised:
        client.health()
    assert not isinstance(raised.value, DaemonOverloadedError)
    assert time.monotonic() - started < 1


# ------------------------------------------------------------------ tail -f
def test_tail_f_through_the_daemon_follows_and_ends_with_the_segment(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("tailed")
    client.append("tailed", b"old\n")
    tail = subprocess.Popen([sys.executable, "-m", "tierfs.cli", "--data-dir", str(daemon.data_dir),
                             "tail", "-n", "1", "-f", "tailed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline() == b"old\n"
        for i in range(50):
            client.append("tailed", b"new %d\n" % i)
        for i in range(50):
            assert tail.stdout.readline() == b"new %d\n" % i
        client.delete("tailed")
        assert tail.wait(timeout=30) != 0
        assert tail.stderr.read().endswith(b"tail: no files remaining\n")  # type: ignore[union-attr]
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
