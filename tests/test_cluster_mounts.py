"""A FUSE mount on each of two cluster daemons shows one namespace: files written through
one mount read back through the other whatever daemon owns their container, `tail -f`
on one follows appends made on the other, and `mv` between containers copies (EXDEV)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.cluster.container_map import container_of
from tierfs.testing.cluster import Cluster

CONTAINERS = 4


@pytest.fixture
def two_mounts(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    cluster = Cluster(tmp_path / "cluster", postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS)
    try:
        first = cluster.mount(0, tmp_path / "mnt-a")
        second = cluster.mount(1, tmp_path / "mnt-b")
        cluster.wait_balanced([0, 1])
        yield first.mountpoint, second.mountpoint
    finally:
        cluster.stop_all()


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout


def test_two_mounts_show_one_namespace(two_mounts: tuple[Path, Path]) -> None:
    a, b = two_mounts
    tops = sorted({f"d{i}" for i in range(12)}, key=lambda n: container_of(n, CONTAINERS))
    for top in tops:
        (a / top).mkdir()
        _run("sh", "-c", f"echo 'line from a' >> {a / top / 'log'}")
        _run("sh", "-c", f"echo 'line from b' >> {b / top / 'log'}")
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir()) == sorted(tops)
    for top in tops:
        assert (a / top / "log").read_text() == (b / top / "log").read_text() == "line from a\nline from b\n"
        assert _run("cat", str(b / top / "log")) == "line from a\nline from b\n"

    follower = subprocess.Popen(["tail", "-n", "+1", "-f", str(b / tops[0] / "log")], stdout=subprocess.PIPE,
                                text=True)
    try:
        _run("sh", "-c", f"echo 'appended on a' >> {a / tops[0] / 'log'}")
        seen = ""
        deadline = time.monotonic() + 20
        assert follower.stdout is not None
        while "appended on a" not in seen and time.monotonic() < deadline:
            seen += follower.stdout.readline()
        assert "appended on a" in seen, seen
    finally:
        follower.kill()
        follower.wait()

    other = next(t for t in tops if container_of(t, CONTAINERS) != container_of(tops[0], CONTAINERS))
    _run("mv", str(a / tops[0] / "log"), str(a / other / "moved"))  # EXDEV: mv copies, then unlinks
    assert (b / other / "moved").read_text() == "line from a\nline from b\nappended on a\n"
    # another host's removal reaches b's kernel when its cached entry expires (1 s)
    deadline = time.monotonic() + 10
    while (b / tops[0] / "log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (b / tops[0] / "log").exists()


def test_growth_on_another_host_reaches_the_mount_at_once(postgres_url: str, tmp_path: Path) -> None:
    """With a 60 s attribute timeout, only the growth channel (PostgreSQL NOTIFY from the
    owner) can tell mount b's kernel that a file appended through mount a grew."""
    cluster = Cluster(tmp_path / "cluster", postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS)
    try:
        a = cluster.mount(0, tmp_path / "mnt-a", "--attr-timeout", "60").mountpoint
        b = cluster.mount(1, tmp_path / "mnt-b", "--attr-timeout", "60").mountpoint
        owners = cluster.wait_balanced([0, 1])
        top = next(f"g{i}" for i in range(100)
                   if owners[container_of(f"g{i}", CONTAINERS)] == cluster.daemon_id(0))  # owned by a's daemon
        (a / top).mkdir()
        _run("sh", "-c", f"echo first >> {a / top / 'log'}")
        fd = os.open(b / top / "log", os.O_RDONLY)  # fstat, as tail -f: no name lookup refreshes it
        try:
            assert os.fstat(fd).st_size == 6  # b's kernel now caches the size for 60 s
            for round_number in range(3):
                _run("sh", "-c", f"echo more >> {a / top / 'log'}")
                expected = 6 + 5 * (round_number + 1)
                deadline = time.monotonic() + 5
                while os.fstat(fd).st_size != expected and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert os.fstat(fd).st_size == expected
        finally:
            os.close(fd)
        assert (b / top / "log").read_text() == "first\n" + "more\n" * 3
    finally:
        cluster.stop_all()
