"""``tierfs.spark.appends`` against a real daemon: a Spark task's appends go over the
daemon's append socket and land in the order given, each once; the first failure reaches the task and nothing given after it
is sent; an append refused for a full backlog is sent again until the daemon takes
it; ``stop`` ends the sending thread at once, dropping what was not sent; the cached
client is one per process."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.contracts.errors import BacklogFullError, SegmentSealedError
from tierfs.contracts.writers import WriterSeq
from tierfs.remote.client import TierClient
from tierfs.spark import appends
from tierfs.spark.appends import PipelinedAppends, task_client
from tierfs.testing.harness import Daemon, start_daemon

KiB = 1 << 10
MiB = 1 << 20


class CountingClient(TierClient):
    """A real client that counts its appends and the backlog refusals it met, and can
    hold the ``hold_at``-th append (1-based) until ``release`` is set."""

    def __init__(self, url: str, hold_at: int = 0) -> None:
        super().__init__(url)
        self.appends_sent = 0
        self.api_appends = 0
        self.refusals = 0
        self.hold_at = hold_at
        self.holding = threading.Event()
        self.release = threading.Event()

    def append(self, name: str, data: object, expected_offset: int | None = None, *,
               length: int | None = None, writer: WriterSeq | None = None) -> int:
        self.api_appends += 1  # the HTTP API: only where the daemon has no append socket
        return super().append(name, data, expected_offset, length=length, writer=writer)  # type: ignore[arg-type]

    def append_on_socket(self, name: str, data: bytes, writer: WriterSeq | None = None) -> int:
        self.appends_sent += 1
        if self.appends_sent == self.hold_at:
            self.holding.set()
            assert self.release.wait(30)
        try:
            return super().append_on_socket(name, data, writer)
        except BacklogFullError:
            self.refusals += 1
            raise


def pieces(count: int) -> list[bytes]:
    """Appends of different sizes and contents, so a reordering or a repeat shows."""
    return [(b"%04d:" % i) * (1000 + 37 * i) for i in range(count)]


def test_appends_land_in_order_each_once(daemon: Daemon) -> None:
    client = CountingClient(daemon.url)
    try:
        given = pieces(40)
        pipe = PipelinedAppends(client, "appends/ordered/p0")
        try:
            for data in given:
                pipe.send(data)
            assert pipe.finish() is True
        finally:
            pipe.stop()
        assert client.appends_sent == len(given)
        assert client.append_socket() is not None and client.api_appends == 0  # the append socket
        assert pipe.sent_bytes == sum(map(len, given))
        assert client.read("appends/ordered/p0", unconfirmed=True) == b"".join(given)
        assert client.stat("appends/ordered/p0").durability == "vd"

        empty = PipelinedAppends(client, "appends/ordered/none")
        assert empty.finish() is False  # nothing given: no segment
        assert [e.name for e in client.ls("appends/ordered")] == ["appends/ordered/p0"]
    finally:
        client.close()


def test_the_first_failure_reaches_the_task_and_nothing_after_it_is_sent(daemon: Daemon) -> None:
    """The third append is held while the task gives two more; the segment is sealed
    under it: the task gets the refusal, the two waiting are never sent."""
    client = CountingClient(daemon.url, hold_at=3)
    other = daemon.client()
    try:
        given = pieces(10)
        pipe = PipelinedAppends(client, "appends/failing/p0")
        try:
            for data in given[:5]:  # 2 sent, 1 held, 2 waiting (APPENDS_WAITING)
                pipe.send(data)
            assert client.holding.wait(10)
            other.op("seal", path="appends/failing/p0")
            client.release.set()
            with pytest.raises(SegmentSealedError):
                for data in given[5:]:
                    pipe.send(data)
                pipe.finish()
            with pytest.raises(SegmentSealedError):  # and again, never a success
                pipe.finish()
        finally:
            pipe.stop()
        assert client.appends_sent == 3
        assert other.read("appends/failing/p0", unconfirmed=True) == b"".join(given[:2])
    finally:
        client.close()
        other.close()


def test_stop_drops_the_appends_waiting(daemon: Daemon) -> None:
    """A task that fails while appends wait: the one under way ends, the waiting ones
    are never sent."""
    client = CountingClient(daemon.url, hold_at=2)
    try:
        given = pieces(4)
        pipe = PipelinedAppends(client, "appends/dropped/p0")
        for data in given:  # 1 sent, 1 held, 2 waiting
            pipe.send(data)
        assert client.holding.wait(10)
        stopper = threading.Thread(target=pipe.stop)
        stopper.start()
        time.sleep(0.2)  # stop is waiting for the append under way
        client.release.set()
        stopper.join(10)
        assert not stopper.is_alive()
        assert client.appends_sent == 2
        assert client.read("appends/dropped/p0", unconfirmed=True) == b"".join(given[:2])
    finally:
        client.close()


@pytest.fixture
def stalled_tier2(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A daemon with a 1 MiB backlog whose tier-2 directory is moved away (a file in
    its place) until the test moves it back: appends beyond the backlog are refused."""
    tier2 = tmp_path / "tier2"
    running = start_daemon(tmp_path / "data", env={
        "TIERFS_TIER2": str(tier2), "TIERFS_FLUSH_INTERVAL_S": "0.05",
        "TIERFS_MAX_BACKLOG_BYTES": str(1 * MiB), "TIERFS_MAX_APPEND_BYTES": str(256 * KiB),
        "TIERFS_TIER2_RETRY_INITIAL_S": "0.05", "TIERFS_TIER2_RETRY_MAX_S": "0.2",
    })
    try:
        away = tmp_path / "tier2-away"
        tier2.mkdir(exist_ok=True)
        tier2.rename(away)
        late = 0
        while True:  # the daemon may write (its metadata backup) and so make the directory again
            try:
                fd = os.open(tier2, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except (FileExistsError, IsADirectoryError):
                late += 1
                tier2.rename(tmp_path / f"tier2-late-{late}")  # then merged: no object it wrote is lost
                shutil.copytree(tmp_path / f"tier2-late-{late}", away, dirs_exist_ok=True)
                continue
            os.write(fd, b"not a directory")
            os.close(fd)
            break
        yield running, tmp_path
    finally:
        running.stop()


def _bring_tier2_back(tmp_path: Path) -> None:
    (tmp_path / "tier2").unlink()
    (tmp_path / "tier2-away").rename(tmp_path / "tier2")


def test_appends_refused_for_a_full_backlog_are_sent_again_until_taken(
        stalled_tier2: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, tmp_path = stalled_tier2
    monkeypatch.setattr(appends, "BACKLOG_RETRY_MAX_S", 0.1)
    client = CountingClient(daemon.url)
    try:
        given = [bytes([65 + i % 26]) * (200 * KiB) for i in range(12)]  # 2.4 MiB > the backlog
        pipe = PipelinedAppends(client, "appends/backlog/p0")
        try:
            sender = threading.Thread(target=lambda: [pipe.send(data) for data in given])
            sender.start()
            deadline_s = time.monotonic() + 30
            while client.refusals < 3:
                assert time.monotonic() < deadline_s, "the backlog never refused an append"
                time.sleep(0.02)
            _bring_tier2_back(tmp_path)
            sender.join(60)
            assert not sender.is_alive()
            assert pipe.finish() is True
        finally:
            pipe.stop()
        assert client.read("appends/backlog/p0", unconfirmed=True) == b"".join(given)  # each once, in order
        assert client.appends_sent == len(given) + client.refusals
    finally:
        client.close()


def test_stop_ends_the_thread_during_a_backlog_pause_and_drops_what_waits(
        stalled_tier2: tuple[Daemon, Path]) -> None:
    """A task that fails while its appends wait for room: ``stop`` (in its ``finally``)
    returns at once; the segment holds a prefix of whole appends, never a later one."""
    daemon, tmp_path = stalled_tier2
    client = CountingClient(daemon.url)
    try:
        given = [bytes([65 + i % 26]) * (200 * KiB) for i in range(12)]
        pipe = PipelinedAppends(client, "appends/stopped/p0")
        for data in given[:8]:  # 1.6 MiB > the backlog: one is refused, others wait behind it
            pipe.send(data)
        deadline_s = time.monotonic() + 30
        while client.refusals < 1:
            assert time.monotonic() < deadline_s, "the backlog never refused an append"
            time.sleep(0.02)
        started_s, sent_at_stop = time.monotonic(), client.appends_sent
        pipe.stop()
        assert time.monotonic() - started_s < 2.0  # not the backlog's 600 s
        assert not any(t.name.startswith("tierfs-append") and t.is_alive() for t in threading.enumerate())
        sent_before = client.appends_sent
        assert sent_before - sent_at_stop <= 1  # at most the one under way: those waiting were dropped
        _bring_tier2_back(tmp_path)
        time.sleep(0.3)
        assert client.appends_sent == sent_before  # nothing sent after the stop
        landed = client.read("appends/stopped/p0", unconfirmed=True)
        assert len(landed) == pipe.sent_bytes < sum(map(len, given[:8]))
        assert landed == b"".join(given)[:len(landed)]
    finally:
        client.close()


def test_the_task_client_is_one_per_process(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    first = task_client(daemon.url, None)
    assert task_client(daemon.url, None) is first
    assert task_client(daemon.url, "a token") is not first
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked worker
    assert task_client(daemon.url, None) is not first
    first.health()
