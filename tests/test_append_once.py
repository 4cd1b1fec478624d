"""Appends land exactly once when an answer is lost (a proxy commits the append at the
daemon and drops the answer), through RemoteStore, fsspec ``ab`` files and the CLI;
and ``tierfs append`` streams with bounded memory and refuses a file too large before
reading it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from tierfs.fsspec_impl import TierFileSystem

from tierfs.contracts.errors import (
    AlreadyAppendedError,
    BadOffsetError,
    InvalidArgumentError,
    ResponseLostError,
)
from tierfs.contracts.writers import Writer
from tierfs.remote.client import TierClient
from tierfs.remote.exactly_once import BytesPayload, append_exactly_once
from tierfs.remote.remote_store import RemoteStore
from tierfs.testing.faults.lossy_proxy import AnswerDroppingProxy
from tierfs.testing.harness import Daemon, start_daemon

MiB = 1 << 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    process = start_daemon(tmp_path_factory.mktemp("once") / "data")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: Unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tfs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _proxy(daemon: Daemon, short_dir: Path, drops: int) -> AnswerDroppingProxy:
    return AnswerDroppingProxy(short_dir / "tierfs.sock", daemon.socket, drops)


def test_remote_store_append_lands_once(daemon: Daemon, short_dir: Path, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    daemon.client().create(name)
    with _proxy(daemon, short_dir, drops=2) as proxy:
        store = RemoteStore(TierClient(f"unix://{proxy.listen_path}"))
        assert trio.run(lambda: store.append(name, b"first ")) == 0
        assert trio.run(lambda: store.append(name, b"second", expected_offset=6)) == 6
        assert proxy.dropped == 2
        store.client.close()
    assert daemon.client().read(name) == b"first second"


def test_a_blind_resend_would_land_twice(daemon: Daemon, short_dir: Path, request: pytest.FixtureRequest) -> None:
    """The failure the retry logic exists for: the raw request committed, the answer was lost."""
    name = request.node.name
    daemon.client().create(name)
    with _proxy(daemon, short_dir, drops=1) as proxy:
        client = TierClient(f"unix://{proxy.listen_path}")
        with pytest.raises(ResponseLostError):
            client.append(name, b"x")
        client.append(name, b"x")
        client.close()
    assert daemon.client().read(name) == b"xx"


def test_fsspec_ab_file_lands_once(daemon: Daemon, short_dir: Path, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    with _proxy(daemon, short_dir, drops=3) as proxy:
        fs = TierFileSystem(url=f"unix://{proxy.listen_path}", direct_reads=False)
        with fs.open(name, "ab") as f:
            f.write(b"abc")
            f.flush()
            f.write(b"def")
        with fs.open(name, "ab") as f:
            f.write(b"ghi")
        fs.pipe_file(name + ".piped", b"piped")
        assert proxy.dropped == 3
    client = daemon.client()
    assert client.read(name) == b"abcdefghi" and client.read(name + ".piped") == b"piped"


def test_a_resend_after_giving_up_lands_once(daemon: Daemon, short_dir: Path, request: pytest.FixtureRequest) -> None:
    """What fsspec's ``close`` does after a flush that failed for good: send the buffer
    again, saying where it may have landed."""
    name = request.node.name
    client = daemon.client()
    client.create(name)
    client.append(name, b"0123")
    identity = Writer().next()
    with _proxy(daemon, short_dir, drops=1) as proxy:
        lossy = TierClient(f"unix://{proxy.listen_path}")
        with pytest.raises(ResponseLostError) as lost:
            append_exactly_once(lossy, name, BytesPayload(b"tail"), conditional=False, writer=identity, budget_s=0)
        assert lost.value.offset is None  # sent without one: the daemon placed it
        client.append(name, b"+other")  # another writer meanwhile
        offset = append_exactly_once(lossy, name, BytesPayload(b"tail"), lost.value.offset,
                                     conditional=False, writer=identity, maybe_landed=True)
        lossy.close()
    assert offset == 4 and client.read(name) == b"0123tail+other"


def test_an_append_without_an_offset_is_one_request_the_daemon_places() -> None:
    """No stat before it and no offset on it (the owner assigns the offset: concurrent
    writers never refuse each other's); after a lost answer the same identity goes
    again, still without an offset; an older append of the writer than the daemon's
    newest is reported, not guessed at."""
    sent: list[tuple[int | None, object]] = []

    class Recording:
        def stat(self, name: str) -> None:
            raise AssertionError("no stat before an unconditional append")

        def append(self, name: str, data: bytes, expected_offset: int | None = None, *,
                   length: int | None = None, writer: object = None) -> int:
            sent.append((expected_offset, writer))
            if len(sent) == 1:
                raise ResponseLostError("the answer was lost")
            if len(sent) == 3:
                raise AlreadyAppendedError(name, "w", 1, 2)
            return 42

    client: Any = Recording()
    assert append_exactly_once(client, "s", BytesPayload(b"x"), conditional=False, budget_s=5) == 42
    assert [offset for offset, _ in sent] == [None, None] and sent[0][1] is sent[1][1]
    with pytest.raises(AlreadyAppendedError):
        append_exactly_once(client, "s", BytesPayload(b"x"), conditional=False)


def test_an_append_is_known_by_its_writer_never_by_its_bytes(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    name = request.node.name
    client = daemon.client()
    client.create(name)
    first = Writer().next()
    assert append_exactly_once(client, name, BytesPayload(b"abc"), 0, conditional=True, writer=first) == 0
    # sent again (an answer lost): answered with where it landed, whatever the offset asked
    assert append_exactly_once(client, name, BytesPayload(b"abc"), 0, conditional=True, writer=first) == 0
    assert append_exactly_once(client, name, BytesPayload(b"abc"), 7, conditional=True, writer=first) == 0
    with pytest.raises(BadOffsetError):  # the same bytes by another writer: another append
        append_exactly_once(client, name, BytesPayload(b"abc"), 0, conditional=True, maybe_landed=True)
    assert append_exactly_once(client, name, BytesPayload(b"abc"), 0, conditional=False) == 3
    with pytest.raises(InvalidArgumentError, match="a writer sequence number names one append"):
        client.append(name, b"abcd", writer=first)
    assert client.read(name) == b"abcabc"


def test_two_writers_with_identical_bytes_and_lost_answers_land_every_append_once(
        daemon: Daemon, short_dir: Path, request: pytest.FixtureRequest) -> None:
    """Path 6 of the data-safety issue: retries recognised by content took another
    writer's identical record for their own (600 acknowledged, 541 present)."""
    name = request.node.name
    daemon.client().create(name)
    rounds = 40
    with _proxy(daemon, short_dir, drops=rounds) as proxy:  # every other answer is lost
        stores = [RemoteStore(TierClient(f"unix://{proxy.listen_path}")) for _ in range(2)]

        async def write(store: RemoteStore) -> None:
            for _ in range(rounds):
                await store.append(name, b"same record\n")

        async def both() -> None:
            async with trio.open_nursery() as nursery:
                for store in stores:
                    nursery.start_soon(write, store)

        trio.run(both)
        assert proxy.dropped == rounds
        for store in stores:
            store.client.close()
    assert daemon.client().read(name) == b"same record\n" * (2 * rounds)


# Linux hands a forked child the parent's peak RSS (ru_maxrss) as its own starting
# point, and pytest grows large: the CLI is started by a small Python that reports the
# CLI's own peak, so the figure is the CLI's and not this process's.
_PEAK_RSS_WRAPPER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _cli_peak_rss(data_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run ``tierfs --data-dir DATA_DIR ARGS``; its result and its own peak RSS in bytes."""
    argv = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args]
    with tempfile.TemporaryDirectory() as scratch:
        peak_file = os.path.join(scratch, "peak_kib")
        result = subprocess.run([sys.executable, "-c", _PEAK_RSS_WRAPPER, peak_file, *argv], capture_output=True)
        with open(peak_file) as f:
            peak_kib = int(f.read())
    return subprocess.CompletedProcess(argv, result.returncode, result.stdout, result.stderr), peak_kib * 1024


def test_cli_append_through_lost_answer_lands_once(daemon: Daemon, short_dir: Path,
                                                   request: pytest.FixtureRequest) -> None:
    name = request.node.name
    daemon.client().create(name)
    source = short_dir / "payload.bin"
    source.write_bytes(os.urandom(3 * MiB))
    with _proxy(daemon, short_dir, drops=2) as proxy:
        assert _cli_peak_rss(short_dir, "append", name, "hello")[0].stdout == b"0\n"
        result, _ = _cli_peak_rss(short_dir, "append", name, "--file", str(source))
        assert result.stdout == b"5\n", result.stderr
        assert proxy.dropped == 2
    assert daemon.client().read(name) == b"hello" + source.read_bytes()


def test_cli_append_file_streams_with_bounded_memory(daemon: Daemon, short_dir: Path,
                                                     request: pytest.FixtureRequest) -> None:
    name = request.node.name
    daemon.client().create(name)
    source = short_dir / "big.bin"
    with open(source, "wb") as f:  # 60 MiB: under the default max_append_bytes (64 MiB)
        f.write(b"z" * MiB)
        f.truncate(60 * MiB)
    baseline, baseline_rss = _cli_peak_rss(daemon.data_dir, "stat", name)
    assert baseline.returncode == 0
    result, rss = _cli_peak_rss(daemon.data_dir, "append", name, "--file", str(source))
    assert result.returncode == 0 and result.stdout == b"0\n", result.stderr
    assert rss < baseline_rss + 24 * MiB, (rss, baseline_rss)  # the file is never held whole
    client = daemon.client()
    assert client.stat(name).appended_length == 60 * MiB
    assert client.read(name, 0, 4) == b"zzzz" and client.read(name, 60 * MiB - 4) == b"\0" * 4


@pytest.mark.parametrize("through_daemon", [True, False], ids=["daemon", "in-process"])
def test_cli_refuses_a_file_too_large_before_reading_it(daemon: Daemon, tmp_path: Path, through_daemon: bool) -> None:
    data_dir = daemon.data_dir if through_daemon else tmp_path / "local"
    source = tmp_path / "huge.bin"
    with open(source, "wb") as f:  # 1 GiB, sparse: costs no disk
        f.truncate(1 << 30)
    result, rss = _cli_peak_rss(data_dir, "append", "nowhere", "--file", str(source))
    assert result.returncode == 1 and b"(too_large)" in result.stderr, result.stderr
    assert rss < 200 * MiB, rss
