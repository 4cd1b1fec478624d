"""The kernel caches attributes and names of the mount for a minute (so ``ls -l`` of a big
directory is one round trip per listing, not one per entry), and still sees every
change the store makes at once, whoever made it: the mount, the API or the CLI.
And ``ls -l`` is told once per device that SELinux labels and ACLs are not supported,
instead of asking the daemon twice per entry."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio
from tierfs.fuse.inodes import InodeTable
from tierfs.fuse.invalidation import KernelNotifier

from tierfs.contracts.errors import SegmentExistsError
from tierfs.testing.harness import Mount

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)

SEEN_WITHIN_S = 2.0  # the notifications coalesce for 5 ms; a loaded machine is slower


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    base = tmp_path_factory.mktemp("caches")
    mounted = Mount(base / "data", base / "mnt")
    yield mounted
    code, stderr = mounted.unmount()
    assert code == 0, stderr


def eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + SEEN_WITHIN_S
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_changes_through_the_api_reach_the_kernel_caches_at_once(mount: Mount) -> None:
    client = mount.client()
    client.create("api/moved", parents=True)
    client.append("api/moved", b"moved\n")
    for name in ("api/removed", "api/sealed", "api/replaced"):
        client.create(name)
        client.append(name, name.encode())
    directory = mount.path("api")
    for entry in sorted(directory.iterdir()):
        entry.stat()  # the kernel now caches every name and its attributes
    assert stat.S_IMODE(os.stat(directory / "sealed").st_mode) & 0o222
    mtime_before = os.stat(directory).st_mtime_ns
    client.op("mv", source="api/moved", target="api/renamed")
    client.delete("api/removed")
    client.op("seal", path="api/sealed")
    client.op("mv", source="api/renamed", target="api/replaced")  # replaces it
    assert eventually(lambda: not (directory / "moved").exists())
    assert eventually(lambda: not (directory / "removed").exists())
    assert eventually(lambda: not stat.S_IMODE(os.stat(directory / "sealed").st_mode) & 0o222)
    assert eventually(lambda: (directory / "replaced").read_bytes() == b"moved\n")
    assert eventually(lambda: os.stat(directory).st_mtime_ns > mtime_before)
    assert sorted(p.name for p in directory.iterdir()) == ["replaced", "sealed"]
    client.close()


def test_xattrs_outside_the_user_namespace_are_not_supported(mount: Mount) -> None:
    path = mount.path("labels.log")
    path.write_bytes(b"x\n")
    for name in ("security.selinux", "system.posix_acl_access", "trusted.anything"):
        with pytest.raises(OSError) as refused:
            os.getxattr(path, name)
        # the kernel itself keeps trusted.* from a user who is not root (ENODATA)
        allowed = {errno.EOPNOTSUPP} | ({errno.ENODATA} if name.startswith("trusted.") and os.getuid() else set())
        assert refused.value.errno in allowed, name
    with pytest.raises(OSError) as missing:
        os.getxattr(path, "user.other")
    assert missing.value.errno == errno.ENODATA
    assert os.getxattr(path, "user.tierfs.durable_length") == b"2"


def test_ls_l_asks_once_per_device_for_labels_and_acls(mount: Mount, tmp_path: Path) -> None:
    directory = mount.path("many")
    directory.mkdir()
    for i in range(50):
        (directory / f"f{i:02d}").write_bytes(b"x")
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")  # dev.sh test installs it
    traced = subprocess.run(["strace", "-f", "-e", "trace=getxattr,lgetxattr", "ls", "-l", str(directory)],
                            capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0, traced.stderr
    calls = [line for line in traced.stderr.splitlines() if "getxattr(" in line]
    assert len(calls) <= 4, calls  # one of each kind, not two per entry
    assert len(traced.stdout.splitlines()) == 51  # "total" and the 50 entries


def test_names_created_through_the_mount_keep_their_inode_and_move_directory_times(mount: Mount) -> None:
    """The mount's own create and mkdir replies give the kernel the new entry, and the
    kernel invalidates the parent's attributes itself: no notification drops the entry
    (which made the kernel forget the inode and look the name up again under a new inode
    number), yet the directory's times and link count move at once, and later changes
    made elsewhere still reach the kernel."""
    directory = mount.path("made-here")
    directory.mkdir()
    before = os.stat(directory)
    inodes = {}
    for i in range(20):  # as the peers benchmark creates small files
        fd = os.open(directory / f"f{i:02d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"s" * 1024)
            inodes[f"f{i:02d}"] = os.fstat(fd).st_ino
        finally:
            os.close(fd)
    (directory / "sub").mkdir()
    inodes["sub"] = os.stat(directory / "sub").st_ino
    after = os.stat(directory)
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_nlink == before.st_nlink + 1  # the new subdirectory's ".."
    time.sleep(0.3)  # well past the notifications' 5 ms coalescing
    assert {name: os.stat(directory / name).st_ino for name in inodes} == inodes
    client = mount.client()
    client.delete("made-here/f00")
    client.create("made-here/f00")
    client.append("made-here/f00", b"from the api")
    assert eventually(lambda: (directory / "f00").read_bytes() == b"from the api")
    client.delete("made-here/f01")
    assert eventually(lambda: not (directory / "f01").exists())
    client.close()


async def test_only_the_mounts_own_change_goes_unnotified(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, bytes]] = []
    monkeypatch.setattr(pyfuse3, "invalidate_entry", lambda inode, name: sent.append((inode, name)))
    monkeypatch.setattr(pyfuse3, "invalidate_inode", lambda inode, attr_only: sent.append((inode, b"")))
    inodes = InodeTable()
    directory = inodes.looked_up("d")
    notifier = KernelNotifier(inodes)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(notifier.run)
        with notifier.made_here("d/mine"):
            notifier.name_changed("d/mine")  # this mount's create: the reply told the kernel
        notifier.name_changed("d/mine")  # a later change made elsewhere
        with pytest.raises(SegmentExistsError), notifier.made_here("d/raced"):
            notifier.name_changed("d/raced")  # the API created it first and used the mark up
            raise SegmentExistsError("d/raced")  # so this mount's create failed
        with notifier.made_here("d/quiet"):
            notifier.name_changed("d/quiet")
        with trio.fail_after(SEEN_WITHIN_S):
            while len(sent) < 3:
                await trio.sleep(0.01)
        await trio.sleep(0.05)  # nothing more comes
        nursery.cancel_scope.cancel()
    assert sorted(sent) == [(directory, b""), (directory, b"mine"), (directory, b"raced")]
