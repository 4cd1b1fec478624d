"""A file on the mount is a file, not a name: descriptors keep the file they opened
across `tierfs mv` and `tierfs rm`, a rename that replaces a name is atomic for a
reader loop of `cat`, a directory whose entries were all unlinked while open is empty,
and names starting with `.tierfs` are the user's. Real mount, real tools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tierfs.testing.harness import Mount

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)


def sh(script: str, mount: Mount) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, in the mount, with ``tierfs`` on the mount's data dir."""
    env = {**os.environ, "TIERFS": f"{sys.executable} -m tierfs.cli --data-dir {mount.data_dir}"}
    return subprocess.run(["bash", "-c", script], cwd=mount.mountpoint, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_descriptor_keeps_its_file_across_tierfs_mv(mount: Mount) -> None:
    result = sh("""
        mkdir mv; cd mv
        printf B > b; printf A > a; exec 3< b
        $TIERFS mv mv/a mv/b
        cat <&3; echo; cat b; echo
        stat -L -c '%s %h' /dev/fd/3
        exec 3<&-
        ls -A
    """, mount)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == ["B", "A", "1 0", "b", ""], result.stdout


def test_reads_and_writes_through_a_descriptor_of_a_removed_file(mount: Mount) -> None:
    path = mount.path("gone")
    path.write_bytes(b"C")
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(mount.data_dir), "rm", "gone"],
                       check=True, capture_output=True)
        assert not path.exists()
        os.write(fd, b"+D")
        os.fsync(fd)
        assert os.pread(fd, 10, 0) == b"C+D"
        assert (os.fstat(fd).st_size, os.fstat(fd).st_nlink) == (3, 0)
    finally:
        os.close(fd)


def test_a_rename_over_a_name_is_atomic_for_a_reader_loop(mount: Mount) -> None:
    (mount.mountpoint / "rn").mkdir()
    result = sh("""
        cd rn; echo 0 > t
        (while :; do cat t > /dev/null 2>> err; done) & reader=$!
        for i in $(seq 1000); do echo $i > t.new; mv t.new t; done
        kill $reader; wait $reader 2> /dev/null
        cat t; grep -c . err || true
    """, mount)
    assert result.returncode == 0, result.stderr
    last, errors = result.stdout.split()
    assert (last, errors) == ("1000", "0"), (mount.path("rn/err").read_text()[:2000])


def test_rmdir_of_a_directory_whose_files_are_all_unlinked_while_open(mount: Mount) -> None:
    directory = mount.path("spark-output")
    directory.mkdir()
    (directory / "part-0").write_bytes(b"rows")
    fd = os.open(directory / "part-0", os.O_RDONLY)
    try:
        os.unlink(directory / "part-0")
        assert subprocess.run(["ls", "-A", str(directory)], capture_output=True, text=True).stdout == ""
        os.rmdir(directory)
        assert not directory.exists()
        assert os.pread(fd, 10, 0) == b"rows"
    finally:
        os.close(fd)


def test_inode_numbers_follow_the_file_across_rename_and_replacement(mount: Mount) -> None:
    result = sh("""
        touch ino-a; stat -c %i ino-a; mv ino-a ino-b; stat -c %i ino-b
        echo x > ino-c; stat -c %i ino-c; mv ino-b ino-c; stat -c %i ino-c
    """, mount)
    first, renamed, other, replaced = result.stdout.split()
    assert first == renamed == replaced != other
    result = sh("""
        mkdir -p ino-d1/inner; stat -c %i ino-d1 ino-d1/inner; mv ino-d1 ino-d2; stat -c %i ino-d2 ino-d2/inner
    """, mount)
    directory, inner, moved, moved_inner = result.stdout.split()
    assert (directory, inner) == (moved, moved_inner) and directory != inner


def test_names_starting_with_tierfs_are_the_users_and_inodes_survive_a_restart(tmp_path: Path) -> None:
    mounted = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        mounted.path(".tierfs-unlinked.3").write_bytes(b"mine")
        mounted.path(".tierfs").mkdir()
        inodes = [mounted.path(name).stat().st_ino for name in (".tierfs", ".tierfs-unlinked.3")]
    finally:
        assert mounted.unmount()[0] == 0
    mounted = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        assert sorted(os.listdir(mounted.mountpoint)) == [".tierfs", ".tierfs-unlinked.3"]
        assert [mounted.path(name).stat().st_ino for name in (".tierfs", ".tierfs-unlinked.3")] == inodes
        assert mounted.path(".tierfs-unlinked.3").read_bytes() == b"mine"
    finally:
        assert mounted.unmount()[0] == 0


def test_a_local_path_under_the_mount_given_to_the_cli_gets_its_store_path(mount: Mount) -> None:
    mount.path("hint.log").write_bytes(b"x\n")
    result = sh(f"$TIERFS cat {mount.path('hint.log')}", mount)
    assert result.returncode == 1
    assert f"under the mount at {mount.mountpoint} that is 'hint.log'" in result.stderr, result.stderr
