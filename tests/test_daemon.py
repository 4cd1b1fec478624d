"""The daemon, its HTTP API and the CLI against it: a real `tierfs serve` process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tierfs.contracts.errors import (
    BadOffsetError,
    InvalidNameError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.testing.cli_runner import run_tierfs
from tierfs.testing.harness import Daemon, free_port, start_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A fresh daemon per test (these tests look at the whole namespace)."""
    running = start_daemon(tmp_path / "data")
    yield running
    running.stop()


def cli(data_dir: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
        input=stdin, capture_output=True, timeout=60,
    )


def here(data_dir: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """The command in this process: what it prints, with or without the daemon's process."""
    return run_tierfs("--data-dir", str(data_dir), *args, stdin=stdin)


def test_api_round_trip(daemon: Daemon) -> None:
    client = daemon.client()
    client.op("mkdir", path="logs")
    info = client.create("logs/a.log", durability="vd")
    assert (info.name, info.durability) == ("logs/a.log", "vd")
    assert client.append("logs/a.log", b"hello ") == 0
    assert client.append("logs/a.log", b"world", expected_offset=6) == 6
    assert client.op("sync", path="logs/a.log") == {"durable": 11}
    assert client.read("logs/a.log") == b"hello world"
    assert client.read("logs/a.log", 6, 9) == b"wor"
    assert client.read("logs/a.log", 11) == b""
    assert [e.name for e in client.ls("logs")] == ["logs/a.log"]
    client.op("flush", path="logs/a.log")
    layout = client.layout("logs/a.log")
    assert layout[0]["start"] == 0 and layout[-1]["end"] == 11
    assert client.op("seal", path="logs/a.log")["sealed"] is True
    with pytest.raises(SegmentSealedError):
        client.append("logs/a.log", b"!")
    client.op("unseal", path="logs/a.log")
    client.op("mv", source="logs/a.log", target="logs/b.log")
    assert client.stat("logs/b.log").length == 11
    client.delete("logs/b.log")
    client.op("rmdir", path="logs")
    assert client.ls("") == []


def test_errors_are_json_with_stable_codes_and_statuses(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("x")
    client.append("x", b"abc")
    expectations = [
        ("GET", "/v1/stat/nope", 404, "not_found"),
        ("PUT", "/v1/segments/x", 409, "exists"),
        ("GET", "/v1/stat/a//b", 400, "invalid_name"),
        ("GET", "/v1/stat/a/%2E%2E/b", 400, "invalid_name"),
        ("POST", "/v1/segments/x?expected_offset=1", 412, "bad_offset"),
        ("POST", "/v1/op/frobnicate", 404, "not_found"),
    ]
    raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://t")
    for method, path, status, code in expectations:
        response = raw.request(method, path, content=b"z")
        assert response.status_code == status, (path, response.text)
        assert response.json()["error"]["code"] == code
    response = raw.get("/v1/segments/x", headers={"Range": "bytes=10-"})
    assert response.status_code == 416 and response.headers["Content-Range"] == "bytes */3"
    response = raw.get("/v1/segments/x", headers={"Range": "bytes=1-"})
    assert (response.status_code, response.content) == (206, b"bc")
    assert response.headers["Content-Range"] == "bytes 1-2/3"
    with pytest.raises(BadOffsetError) as excinfo:
        client.append("x", b"z", expected_offset=0)
    assert (excinfo.value.expected, excinfo.value.actual) == (0, 3)
    with pytest.raises(SegmentNotFoundError):
        client.stat("nope")
    with pytest.raises(SegmentExistsError):
        client.create("x")
    with pytest.raises(InvalidNameError):
        client.stat("a//b")
    assert client.read("x") == b"abc"  # nothing changed


def test_an_error_answered_before_the_body_arrived_leaves_the_connection_usable(daemon: Daemon) -> None:
    """The body's last bytes arrive after the error is decided (a slow client, or just
    the next packet): the answer waits for them, and the same connection serves the
    next request instead of closing under the client."""
    import socket

    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(daemon.socket))
        conn.sendall(b"POST /v1/op/frobnicate HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nab")
        time.sleep(0.3)  # the route is unknown long before the body is complete
        conn.sendall(b"cd")
        conn.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
        answers = b""
        conn.settimeout(30)
        while answers.count(b"HTTP/1.1 ") < 2 or not answers.rstrip().endswith(b"}"):
            piece = conn.recv(65536)
            assert piece, f"the daemon closed the connection after: {answers!r}"
            answers += piece
    assert answers.startswith(b"HTTP/1.1 404 ") and b"HTTP/1.1 200 " in answers


def test_follow_long_polls_until_new_durable_data(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("f")
    start = time.monotonic()
    data, durable = client.follow_once("f", 0, timeout_s=0.3)
    assert (data, durable) == (b"", 0) and time.monotonic() - start >= 0.25

    def append_later() -> None:
        time.sleep(0.2)
        daemon.client().append("f", b"news")

    threading.Thread(target=append_later).start()
    start = time.monotonic()
    data, durable = client.follow_once("f", 0, timeout_s=10)
    assert (data, durable) == (b"news", 4)
    assert time.monotonic() - start < 5


def test_metrics(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("m")
    client.append("m", b"x" * 100)
    raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://t")
    text = raw.get("/metrics").text
    for name in ("tierfs_appends_total 1.0", "tierfs_appended_bytes_total 100.0", "tierfs_journal_bytes",
                 "tierfs_flush_backlog_bytes", "tierfs_flush_lag_seconds", "tierfs_cache_hits_total",
                 "tierfs_cache_misses_total", "tierfs_tier2_gets_total"):
        assert name in text
    assert "tierfs_container_" not in text  # per-container figures: cluster mode only


def test_owner_only_by_default(daemon: Daemon) -> None:
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.data_dir.stat().st_mode) == 0o700


def test_tcp_needs_the_bearer_token_which_is_never_logged(tmp_path: Path) -> None:
    port = free_port()
    running = start_daemon(tmp_path / "d", "--listen", f"127.0.0.1:{port}")
    try:
        token_file = tmp_path / "d" / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/health").status_code == 401
        assert httpx.get(f"{url}/v1/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and ok.json()["status"] == "ok"
        from tierfs.remote.client import TierClient

        TierClient(url, token=token).create("over-tcp")
    finally:
        code, stderr = running.stop()
    assert code == 0
    assert token not in stderr


def test_second_daemon_is_refused_and_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "d"
    first = start_daemon(data)
    client = first.client()
    client.create("s", durability="vd")
    client.append("s", b"before shutdown")
    second = cli(data, "serve")
    assert second.returncode == 4
    assert f"in use by pid {first.proc.pid}".encode() in second.stderr
    code, stderr = first.stop()
    assert code == 0, stderr
    assert "shutting down" in stderr
    assert not (data / "tierfs.sock").exists()
    stat_out = json.loads(cli(data, "stat", "s", "--json").stdout)  # in-process now
    assert stat_out["length"] == stat_out["flushed_length"] == len(b"before shutdown")


def test_cli_output_is_the_same_with_and_without_a_daemon(tmp_path: Path) -> None:
    data = tmp_path / "d"
    assert here(data, "mkdir", "logs").returncode == 0
    assert here(data, "create", "logs/app.log").returncode == 0
    lines = b"".join(b"line %d\n" % i for i in range(30))
    assert here(data, "append", "logs/app.log", "-", stdin=lines).stdout == b"0\n"
    here(data, "flush")
    commands = [
        ["cat", "logs/app.log"], ["cat", "logs/app.log", "--offset", "7", "--length", "9"],
        ["stat", "logs/app.log", "--json"], ["ls", "-l", "logs"], ["ls"],
        ["tail", "-n", "3", "logs/app.log"], ["tail", "-c", "5", "logs/app.log"],
        ["cat", "missing"], ["append", "logs/app.log", "x", "--expected-offset", "1"],
        ["fsck"], ["sync", "logs/app.log"],
    ]
    local = [here(data, *c) for c in commands]
    running = start_daemon(data)
    try:
        remote = [here(data, *c) for c in commands]
    finally:
        running.stop()
    for command, a, b in zip(commands, local, remote, strict=True):
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), command
    assert local[5].stdout == b"line 27\nline 28\nline 29\n"


def test_tail_follow_sees_appends(daemon: Daemon) -> None:
    client = daemon.client()
    client.create("t")
    client.append("t", b"first\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(daemon.data_dir), "tail", "-f", "t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first\n"
        for i in range(3):
            client.append("t", b"next %d\n" % i)
            assert proc.stdout.readline() == b"next %d\n" % i
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert os.path.exists(daemon.socket)


def test_the_daemon_caps_malloc_arenas_on_glibc() -> None:
    import platform

    from tierfs.server.process_memory import limit_malloc_arenas

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("per-thread malloc arenas are glibc's")
    assert limit_malloc_arenas() is True
