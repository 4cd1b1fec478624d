"""Pipelined appends (issue 19 item 5): the daemon's append socket and the fsspec files
that send their appends back to back on it.

The socket answers as the API and executes a connection's requests strictly in order,
none after one that failed; concurrent fsspec writers never interleave inside a flush
and each writer's flushes land exactly once in the order it flushed, also when a
connection breaks with answers unread; durability levels hold as through the API."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tierfs.fsspec_impl import TierFileSystem

from tierfs.contracts.datadir import append_socket_path
from tierfs.contracts.errors import BadOffsetError, SegmentSealedError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.remote.append_pipeline import AppendPipeline
from tierfs.testing.faults.lossy_proxy import AnswerDroppingProxy, UnixSocketProxy, close_both
from tierfs.testing.harness import Daemon, start_daemon

WAIT_S = 30.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: Unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tfs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fs(url: str, durability: str | None = None) -> TierFileSystem:
    return TierFileSystem(url=url, durability=durability, skip_instance_cache=True)


# ------------------------------------------------------------------ the raw socket
def _raw(daemon: Daemon) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.connect(str(append_socket_path(daemon.data_dir)))
    return sock


def _post(name: str, body: bytes, expected_offset: int | None = None, extra: str = "") -> bytes:
    query = "" if expected_offset is None else f"?expected_offset={expected_offset}"
    return (f"POST /v1/segments/{name}{query} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


def _answers(sock: socket.socket) -> list[tuple[int, dict[str, object]]]:
    """Every answer until the daemon closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
        answers.append((int(lines[0].split()[1]), json.loads(rest[:length])))
        data = rest[length:]
    return answers


def test_requests_run_in_order_and_none_after_one_that_failed(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    client = daemon.client()
    client.create(name)
    with _raw(daemon) as sock:
        sock.sendall(_post(name, b"one ") + _post(name, b"two ", 4) + _post(name, b"late", 0)
                     + _post(name, b"never", 8) + _post(name, b"", extra="connection: close\r\n"))
        answers = _answers(sock)
    assert answers[:2] == [(200, {"offset": 0, "length": 4}), (200, {"offset": 4, "length": 4})]
    status, error = answers[2]
    assert status == 412 and error["error"]["code"] == "bad_offset"  # type: ignore[index]
    assert len(answers) == 3  # the connection ended there: 'never' did not run
    assert client.read(name) == b"one two "


def test_the_socket_refuses_what_is_not_an_append(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    daemon.client().create(name)
    limit = daemon.client().health()["max_append_bytes"]
    cases = [
        (b"GET /v1/segments/x HTTP/1.1\r\nhost: t\r\n\r\n", 405, "invalid_argument"),
        (b"POST /v1/op/mkdir HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n", 404, "not_found"),
        (f"POST /v1/segments/{name} HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n".encode(),
         411, "invalid_argument"),
        (f"POST /v1/segments/{name} HTTP/1.1\r\nhost: t\r\ncontent-length: {limit + 1}\r\n\r\n".encode(),
         413, "too_large"),  # refused from its Content-Length: no body was sent
        (_post(name, b"x", -1), 400, "invalid_argument"),
        (_post("a%2F..%2Fb", b"x"), 400, "invalid_name"),
        (_post("no-such-segment", b"x"), 404, "not_found"),
    ]
    for raw, status, code in cases:
        with _raw(daemon) as sock:
            sock.sendall(raw)
            answers = _answers(sock)
        assert [(s, a["error"]["code"]) for s, a in answers] == [(status, code)], raw  # type: ignore[index]
    assert daemon.client().read(name) == b""


def test_a_sealed_segment_fails_the_file_with_the_same_error(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    fs = _fs(daemon.url)
    with fs.open(name, "ab", block_size=1024) as f:
        f.write(b"a" * 1024)  # sent, answered later
        f.flush()
        daemon.client().op("seal", path=name)
        f.write(b"b" * 1024)
        with pytest.raises(SegmentSealedError):
            f.flush()
        daemon.client().op("unseal", path=name)
        f.flush()  # the append that failed is sent again, once
    assert daemon.client().read(name) == b"a" * 1024 + b"b" * 1024


# ------------------------------------------------------------------ concurrent writers
def _record(writer: int, seq: int) -> bytes:
    body = bytes([65 + writer]) * (100 + (seq * 37 + writer * 11) % 900)
    return f"[{writer}:{seq}:{len(body)}]".encode() + body + b"\n"


def _parse(data: bytes) -> list[tuple[int, int]]:
    """The records of ``data`` as (writer, seq); fails on any byte out of place."""
    records, position = [], 0
    while position < len(data):
        head_end = data.index(b"]", position)
        writer, seq, length = (int(x) for x in data[position + 1:head_end].split(b":"))
        assert data[position:head_end + 1 + length + 1] == _record(writer, seq), f"torn record at {position}"
        records.append((writer, seq))
        position = head_end + 1 + length + 1
    return records


def test_concurrent_writers_never_interleave_inside_a_flush(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    """Four writers, each a pipelining ``ab`` file of small buffers (an append every few
    records) and explicit flushes, on one segment: records stay whole, and each writer's
    land once, in its order, though the writers keep taking each other's offsets."""
    name, writers, per_writer = request.node.name, 4, 300
    fs = _fs(daemon.url)
    fs.touch(name)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            with fs.open(name, "ab", block_size=4096) as f:
                for seq in range(per_writer):
                    f.write(_record(writer, seq))  # whole records per write: appends end between them
                    if seq % 50 == 49:
                        f.flush()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not errors, errors
    records = _parse(daemon.client().read(name))
    for writer in range(writers):
        assert [seq for w, seq in records if w == writer] == list(range(per_writer))
    assert len(records) == writers * per_writer


# ------------------------------------------------------------------ lost answers
class AnswerSwallowingProxy(UnixSocketProxy):
    """A Unix socket in front of the append socket: it forwards every request, and on
    each of its first ``cuts`` connections swallows the answers and cuts the connection
    once ``answers`` of them came (those appends ran; the client never hears it)."""

    def __init__(self, listen_path: Path, target_path: Path, cuts: int, answers: int) -> None:
        self.cuts, self.answers = cuts, answers
        self.cut = 0
        super().__init__(listen_path, target_path)

    def _connection_state(self) -> bool:
        cutting = self.cut < self.cuts  # connections are accepted one at a time
        self.cut += cutting
        return cutting

    def _answers(self, upstream: socket.socket, client: socket.socket, cutting: bool) -> None:
        seen = 0
        try:
            while data := upstream.recv(65536):
                if not cutting:
                    client.sendall(data)
                    continue
                seen += data.count(b"HTTP/1.1 ")
                if seen >= self.answers:
                    break
        except OSError:
            pass
        close_both(client, upstream)


@pytest.mark.parametrize("answers", [1, 2], ids=["cut-after-one-answer", "cut-after-two-answers"])
def test_a_connection_cut_mid_pipeline_lands_every_flush_once(daemon: Daemon, short_dir: Path, answers: int,
                                                             request: pytest.FixtureRequest) -> None:
    """The append socket's first three connections are cut after one or two appends
    ran, their answers unread, while the next append was on its way: every flush still
    lands exactly once, in order."""
    name = request.node.name
    api = AnswerDroppingProxy(short_dir / "tierfs.sock", daemon.socket, drops=0)
    appends = AnswerSwallowingProxy(short_dir / "tierfs-append.sock", append_socket_path(daemon.data_dir),
                                    cuts=3, answers=answers)
    try:
        fs = _fs(f"unix://{short_dir / 'tierfs.sock'}")
        with fs.open(name, "ab", block_size=2048) as f:
            for seq in range(60):
                f.write(_record(0, seq))
        assert appends.cut == 3
    finally:
        appends.close()
        api.close()
    assert _parse(daemon.client().read(name)) == [(0, seq) for seq in range(60)]


def test_a_conditional_pipeline_finding_another_writer_fails(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    client = daemon.client()
    client.create(name)
    pipeline = AppendPipeline(client, name, end=0, conditional=True)
    try:
        pipeline.submit(b"mine")
        client.append(name, b"theirs")  # lands first or second: either way one of ours is refused
        pipeline.submit(b"more")
        with pytest.raises(BadOffsetError):
            pipeline.wait()
    finally:
        pipeline.close()
    data = client.read(name)
    assert data in (b"theirs", b"minetheirs")


# ------------------------------------------------------------------ durability
@pytest.mark.parametrize("durability", ["pd", "tier2"])
def test_pipelined_appends_keep_their_durability_level(tmp_path: Path, durability: str) -> None:
    """Once the file is closed every byte is durable (pd) or in tier-2 (tier2): a kill -9
    (and, for tier2, the loss of the journal) takes none of it."""
    data_dir = tmp_path / "data"
    daemon = start_daemon(data_dir)
    payload = b"".join(_record(1, seq) for seq in range(2000))
    try:
        fs = _fs(daemon.url, durability)
        with fs.open("durable/log", "wb", block_size=64 << 10) as f:
            for offset in range(0, len(payload), 10_000):
                f.write(payload[offset:offset + 10_000])
        info = daemon.client().stat("durable/log")
        assert isinstance(info, SegmentInfo) and info.durability == durability
        assert info.durable_length == len(payload)
        if durability == "tier2":
            assert info.flushed_length == len(payload)
        daemon.kill9()
        if durability == "tier2":
            shutil.rmtree(data_dir / "journal")
        daemon = start_daemon(data_dir)
        assert daemon.client().read("durable/log") == payload
    finally:
        daemon.stop()
