"""Disk full on the data dir (issue 15, item 3), on a real 16 MiB tmpfs with real
daemons: a full journal disk refuses appends with ``no_space`` (HTTP 507, CLI exit 6)
and changes nothing, reads keep working, appends resume once space is freed, and
flushed journal bytes go back to the disk."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tierfs.contracts.errors import BacklogFullError, NoSpaceError
from tierfs.engine import space_reserve
from tierfs.engine.journal.frames import FRAME_OVERHEAD, ScanResult, list_files
from tierfs.engine.journal.log import Journal
from tierfs.engine.journal.scan import scan
from tierfs.testing.harness import Mount, start_daemon

KiB, MiB = 1 << 10, 1 << 20
DISK_BYTES = 16 * MiB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own (mounting needs root, as in CI)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def daemon_env(tmp_path: Path, **settings: object) -> dict[str, str]:
    """Tier-2 lives off the small disk, so flushing gives journal space back."""
    env = {"TIERFS_TIER2": str(tmp_path / "tier2"), "TIERFS_FLUSH_INTERVAL_S": "0.05"}
    env.update({f"TIERFS_{key.upper()}": str(value) for key, value in settings.items()})
    return env


def fill(disk: Path) -> Path:
    """Grow a filler file until the disk is full; returns it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 * MiB, 4 * KiB, 1):  # big steps, then fill the last blocks
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def cli(data_dir: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
        input=stdin, capture_output=True, timeout=60,
    )


def journal_bytes_on_disk(data_dir: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in (data_dir / "journal").iterdir())


def test_full_disk_refuses_appends_clearly_keeps_serving_and_resumes(
    small_disk: Path, tmp_path: Path
) -> None:
    data = small_disk / "data"
    daemon = start_daemon(data, env=daemon_env(tmp_path))
    try:
        client = daemon.client()
        client.create("log")
        expected = b"".join(bytes([i]) * (100 * KiB) for i in range(5))
        for i in range(5):
            client.append("log", expected[i * 100 * KiB : (i + 1) * 100 * KiB])
        client.op("flush", name="log")
        filler = fill(small_disk)

        with pytest.raises(NoSpaceError) as refused:
            for _ in range(32):  # what the journal reserved ahead (1 MiB) still takes appends
                expected += b"x" * (256 * KiB)
                client.append("log", b"x" * (256 * KiB))
        expected = expected[: -256 * KiB]
        assert refused.value.code == "no_space" and str(data / "journal") in str(refused.value)
        fill(small_disk)  # in case a flush gave journal space back meanwhile
        raw = httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket)), base_url="http://t")
        response = raw.post("/v1/segments/log", content=b"y" * (512 * KiB))
        assert response.status_code == 507 and response.json()["error"]["code"] == "no_space"
        fill(small_disk)
        result = cli(data, "append", "log", stdin=b"z" * (512 * KiB))
        assert result.returncode == 6 and b"journal disk" in result.stderr, result.stderr

        # Nothing changed, and the daemon keeps serving reads, the CLI's included.
        assert client.stat("log").length == len(expected)
        assert client.read("log") == expected
        assert cli(data, "cat", "log").stdout == expected

        filler.unlink()  # space is back: appends resume without a restart
        assert client.append("log", b"after") == len(expected)
        client.op("sync", name="log")
        assert client.read("log") == expected + b"after"
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr
    assert "journal_corrupt" not in stderr and "Traceback" not in stderr


def test_flushed_journal_bytes_go_back_to_the_disk(small_disk: Path, tmp_path: Path) -> None:
    """40 MiB through a 16 MiB disk with 64 MiB journal files: the journal holds the
    unflushed bytes (bounded by the backlog) plus one early-rolled file, never what
    tier-2 already has."""
    data = small_disk / "data"
    settings = dict(max_backlog_bytes=2 * MiB, max_append_bytes=1 * MiB)
    daemon = start_daemon(data, env=daemon_env(tmp_path, **settings))
    peak_bytes = 0
    try:
        client = daemon.client()
        client.create("big")
        piece = os.urandom(256 * KiB)
        appended = 0
        deadline_s = time.monotonic() + 60
        while appended < 40 * MiB:
            assert time.monotonic() < deadline_s, f"only {appended} bytes appended in 60 s"
            try:
                client.append("big", piece)
            except BacklogFullError:
                time.sleep(0.02)  # the storage writer is catching up
                continue
            appended += len(piece)
            peak_bytes = max(peak_bytes, journal_bytes_on_disk(data))
        client.op("sync", name="big")
        assert client.stat("big").length == 40 * MiB
        settle_s = time.monotonic() + 10
        while journal_bytes_on_disk(data) > 5 * MiB and time.monotonic() < settle_s:
            time.sleep(0.05)
        assert journal_bytes_on_disk(data) <= 5 * MiB  # < RECLAIM_AFTER_BYTES + reservation
        assert client.read("big", 40 * MiB - len(piece)) == piece
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr
    # unflushed (<= 2 MiB backlog) + one file rolled once 4 MiB of it are flushed (so
    # <= 4 + 2 MiB) + 1 MiB reserved ahead
    assert peak_bytes <= 10 * MiB, peak_bytes


def test_store_opens_and_serves_reads_on_a_full_disk(small_disk: Path, tmp_path: Path) -> None:
    data = small_disk / "data"
    env = daemon_env(tmp_path)
    first = start_daemon(data, env=env)
    client = first.client()
    client.create("log")
    client.append("log", b"flushed " * 1000)
    client.op("flush", name="log")
    client.append("log", b"journal only")  # VD: in the journal, replayed on restart
    client.op("sync", name="log")
    expected = b"flushed " * 1000 + b"journal only"
    first.kill9()  # leaves the WAL, the journal and the replay work behind
    filler = fill(small_disk)

    daemon = start_daemon(data, env=env)
    try:
        client = daemon.client()
        assert client.stat("log").length == len(expected)
        assert client.read("log") == expected
        assert cli(data, "cat", "log").stdout == expected
        fill(small_disk)
        with pytest.raises(NoSpaceError):
            client.append("log", b"x" * (2 * MiB))
        filler.unlink()
        assert client.append("log", b"!") == len(expected)
        client.op("flush", name="log")
        assert client.read("log") == expected + b"!"
    finally:
        code, stderr = daemon.stop()
    assert code == 0, stderr


@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)
def test_the_mount_answers_enospc_and_resumes(small_disk: Path, tmp_path: Path) -> None:
    mounted = Mount(small_disk / "data", tmp_path / "mnt", env=daemon_env(tmp_path))
    try:
        path = mounted.path("log")
        path.write_bytes(b"first line\n")
        expected = b"first line\n"
        filler = fill(small_disk)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            with pytest.raises(OSError) as refused:
                for _ in range(32):  # the journal's 1 MiB reserved ahead still takes some
                    expected += b"m" * os.write(fd, b"m" * (256 * KiB))
            assert refused.value.errno == errno.ENOSPC
            assert path.read_bytes() == expected  # nothing half-written, reads go on
            filler.unlink()
            os.write(fd, b"resumed\n")
        finally:
            os.close(fd)
        assert path.read_bytes() == expected + b"resumed\n"
    finally:
        code, stderr = mounted.unmount()
    assert code == 0, stderr


async def test_a_write_hitting_enospc_where_fallocate_is_missing_waits_for_space(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without reservation write(2) itself hits ENOSPC mid-frame: the file is cut back to
    its last whole frame and the journal stalls: the frame stays queued (its appender
    waits, neither acknowledged nor refused), new frames are refused with nothing
    changed, and the retry task writes it once space is back."""
    monkeypatch.setattr(space_reserve, "_fallocate", None)
    directory = small_disk / "journal"
    directory.mkdir()
    journal = Journal(directory, start_lsn=0, next_seq=1, file_bytes=64 * MiB,
                      vd_sync_interval_s=1.0, on_durable=lambda lsn: None)
    journal.add_append(1, 0, b"kept")
    assert journal.write_queued()
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 100 * KiB)  # room for part of a frame
    waiting = b"t" * (256 * KiB)
    _, end_lsn = journal.add_append(1, 4, waiting)
    assert not journal.write_queued()
    with pytest.raises(NoSpaceError):
        journal.add_append(1, 4 + len(waiting), b"later")
    with pytest.raises(NoSpaceError):
        await journal.sync()
    (path,) = directory.iterdir()
    assert path.stat().st_size == FRAME_OVERHEAD + 4
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        written = trio.Event()

        async def vd_appender() -> None:
            await journal.wait_written(end_lsn)
            written.set()

        nursery.start_soon(vd_appender)
        await trio.sleep(0.3)  # the retry task tries, and the disk is still full
        assert not written.is_set() and journal.written_lsn < end_lsn
        filler.unlink()
        await written.wait()
        await journal.sync()
        journal.add_append(1, 4 + len(waiting), b"later")
        await journal.sync()
        nursery.cancel_scope.cancel()
    await journal.close()
    result = ScanResult(end_lsn=0, next_seq=1)
    frames = list(scan(list_files(directory), 1 << 20, result))
    assert [f.data for f in frames] == [b"kept", waiting, b"later"] and result.cut is None
