"""The FUSE mount, mounted for real and driven with standard tools.

Each test uses the module's mount (``tierfs mount --foreground`` in a subprocess) unless
it needs its own (crash, daemonizing). Skipped only where /dev/fuse or fusermount3 is
missing (CI has both).
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from tierfs.fsspec_impl import TierFileSystem
from tierfs.fuse.mount import is_mount_point

from tierfs.contracts.datadir import process_running
from tierfs.testing.harness import Mount, processes

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)

MiB = 1 << 20
WAIT_S = 30.0  # generous bound for things that happen "soon" on a loaded machine


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    base = tmp_path_factory.mktemp("fuse")
    # a long attribute timeout: size changes must reach the kernel by notification
    mounted = Mount(base / "data", base / "mnt", "--attr-timeout", "60")
    yield mounted
    code, stderr = mounted.unmount()
    assert code == 0, stderr
    assert not is_mount_point(mounted.mountpoint)


@pytest.fixture
def served_data_dir(mount: Mount) -> Path:
    """``tfs`` (conftest) talks to the mount's daemon."""
    return mount.data_dir


def run(*command: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload, no-any-return]


def sha256_of(path: Path) -> str:
    return run("sha256sum", str(path)).stdout.split()[0]


def metric(mount: Mount, name: str) -> float:
    return mount.client().metrics()[name]


# ---------------------------------------------------------------- data in and out
def test_cp_50_mib_in_and_sha256sum_back(mount: Mount, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(50 * MiB))
    run("mkdir", "-p", str(mount.path("cp")))
    run("cp", str(source), str(mount.path("cp/big.bin")))
    assert sha256_of(mount.path("cp/big.bin")) == hashlib.sha256(source.read_bytes()).hexdigest()
    assert os.stat(mount.path("cp/big.bin")).st_size == 50 * MiB
    mount.client().op("flush", path="cp/big.bin")  # now from chunks, not the tail
    assert sha256_of(mount.path("cp/big.bin")) == hashlib.sha256(source.read_bytes()).hexdigest()


def test_shell_redirections_and_dd_append(mount: Mount) -> None:
    path = mount.path("shell.txt")
    subprocess.run(f"echo first > {path}", shell=True, check=True)
    subprocess.run(f"echo second >> {path}", shell=True, check=True)
    subprocess.run(f"printf 'third\\n' | cat >> {path}", shell=True, check=True)
    size = os.stat(path).st_size
    run("dd", "if=/dev/zero", f"of={path}", "bs=4", "count=1", f"seek={size}", "oflag=seek_bytes",
        "conv=notrunc")
    assert path.read_bytes() == b"first\nsecond\nthird\n" + b"\0" * 4


def test_two_shells_appending_at_once_lose_nothing_and_never_interleave(mount: Mount) -> None:
    path = mount.path("two-shells.log")
    path.touch()
    script = 'for i in $(seq 1 300); do echo "{w}-$i-xxxxxxxxxxxxxxxxxxxxxxxx" >> {p}; done'
    shells = [subprocess.Popen(["bash", "-c", script.format(w=w, p=path)]) for w in "ab"]
    assert [s.wait(timeout=120) for s in shells] == [0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 600
    for writer in "ab":
        mine = [line for line in lines if line.startswith(writer + "-")]
        assert mine == [f"{writer}-{i}-xxxxxxxxxxxxxxxxxxxxxxxx" for i in range(1, 301)]


def test_o_append_writer_appends_after_writes_from_elsewhere(mount: Mount) -> None:
    path = mount.path("o-append.log")
    with open(path, "ab", buffering=0) as f:
        f.write(b"one\n")
        mount.client().append("o-append.log", b"api\n")  # behind the kernel's back
        f.write(b"two\n")
    assert path.read_bytes() == b"one\napi\ntwo\n"


def test_tail_f_sees_appended_lines(mount: Mount) -> None:
    path = mount.path("tail.log")
    path.write_bytes(b"start\n")
    tail = subprocess.Popen(["tail", "-f", "-n", "+1", str(path)], stdout=subprocess.PIPE)
    assert tail.stdout is not None
    try:
        seen = b""

        def read_until(wanted: bytes) -> None:
            nonlocal seen
            deadline = time.monotonic() + WAIT_S
            while wanted not in seen:
                ready, _, _ = select.select([tail.stdout], [], [], max(0.0, deadline - time.monotonic()))
                assert ready, f"tail -f did not show {wanted!r}; saw {seen!r}"
                seen += os.read(tail.stdout.fileno(), 65536)  # type: ignore[union-attr]

        read_until(b"start\n")
        with open(path, "ab") as f:
            f.write(b"through the mount\n")
        read_until(b"through the mount\n")
        mount.client().append("tail.log", b"through the API\n")
        read_until(b"through the API\n")
        assert seen == b"start\nthrough the mount\nthrough the API\n"
    finally:
        tail.kill()
        tail.wait()


def test_size_growth_reaches_the_kernel_without_waiting_for_the_attribute_timeout(mount: Mount) -> None:
    # the module's mount caches attributes for 60 s: only a notification shows growth
    path = mount.path("grow.bin")
    path.write_bytes(b"x" * 10)
    assert os.stat(path).st_size == 10
    mount.client().append("grow.bin", b"y" * 5)
    deadline = time.monotonic() + WAIT_S
    while os.stat(path).st_size != 15:
        assert time.monotonic() < deadline, "the kernel never heard that the file grew"
        time.sleep(0.01)
    assert path.read_bytes() == b"x" * 10 + b"y" * 5  # no stale cached page


def test_reads_fetch_each_block_once_under_kernel_read_ahead(mount: Mount, tmp_path: Path) -> None:
    data = os.urandom(8 * MiB)
    mount.path("ra.bin").write_bytes(data)
    mount.client().op("flush", path="ra.bin")
    gets_before = metric(mount, "tierfs_tier2_gets_total")
    fetched_before = metric(mount, "tierfs_tier2_fetched_bytes_total")
    assert hashlib.sha256(mount.path("ra.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert metric(mount, "tierfs_tier2_fetched_bytes_total") - fetched_before == 8 * MiB  # each block once
    assert 1 <= metric(mount, "tierfs_tier2_gets_total") - gets_before <= 8  # read-ahead runs: fewer GETs


# ---------------------------------------------------------------- append-only rules
def test_dd_at_a_wrong_offset_fails_and_changes_nothing(mount: Mount) -> None:
    path = mount.path("dd.bin")
    path.write_bytes(b"0123456789")
    result = run("dd", "if=/dev/zero", f"of={path}", "bs=1", "count=2", "seek=3", "conv=notrunc",
                 check=False)
    assert result.returncode != 0 and "Operation not permitted" in result.stderr
    result = run("dd", "if=/dev/zero", f"of={path}", "bs=1", "count=2", "seek=20", "conv=notrunc",
                 check=False)
    assert result.returncode != 0
    assert path.read_bytes() == b"0123456789"


def test_truncation_is_refused_except_to_the_current_length(mount: Mount) -> None:
    path = mount.path("trunc.txt")
    path.write_bytes(b"keep me")
    with pytest.raises(PermissionError):
        open(path, "wb").close()  # O_TRUNC
    assert run("truncate", "-s", "3", str(path), check=False).returncode != 0
    assert run("truncate", "-s", "100", str(path), check=False).returncode != 0
    os.truncate(path, 7)  # the current length: a no-op
    subprocess.run(f"echo nope > {path}", shell=True, check=False, capture_output=True)
    assert path.read_bytes() == b"keep me"
    empty = mount.path("trunc-empty.txt")
    empty.touch()
    empty.write_bytes(b"fine")  # O_TRUNC of an empty segment is allowed
    assert empty.read_bytes() == b"fine"


def test_chmod_seals_and_unseals(mount: Mount) -> None:
    path = mount.path("seal.txt")
    path.write_bytes(b"a")
    run("chmod", "a-w", str(path))
    assert os.stat(path).st_mode & 0o777 == 0o444
    assert mount.client().stat("seal.txt").sealed
    with pytest.raises(PermissionError):
        with open(path, "ab") as f:
            f.write(b"b")
    assert subprocess.run(f"echo b >> {path}", shell=True, capture_output=True).returncode != 0
    run("chmod", "u+w", str(path))
    assert not mount.client().stat("seal.txt").sealed
    with open(path, "ab") as f:
        f.write(b"c")
    assert path.read_bytes() == b"ac"


def test_mkdir_ls_mv_rm_rmdir(mount: Mount) -> None:
    run("mkdir", "-p", str(mount.path("ns/inner")))
    mount.path("ns/inner/one.txt").write_bytes(b"1" * 100)
    mount.path("ns/two.txt").write_bytes(b"2" * 7)
    listing = run("ls", "-l", str(mount.path("ns"))).stdout
    sizes = {line.split()[-1]: line.split()[4] for line in listing.splitlines()[1:]}
    assert sizes == {"inner": "0", "two.txt": "7"}
    assert sorted(os.listdir(mount.path("ns/inner"))) == ["one.txt"]
    run("mv", str(mount.path("ns/inner")), str(mount.path("ns/moved")))
    assert mount.path("ns/moved/one.txt").read_bytes() == b"1" * 100
    assert not mount.path("ns/inner").exists()
    assert mount.client().stat("ns/moved/one.txt").length == 100
    run("mv", str(mount.path("ns/two.txt")), str(mount.path("ns/moved/two.txt")))
    failed = run("rmdir", str(mount.path("ns/moved")), check=False)
    assert failed.returncode != 0 and "not empty" in failed.stderr
    run("rm", str(mount.path("ns/moved/one.txt")), str(mount.path("ns/moved/two.txt")))
    run("rmdir", str(mount.path("ns/moved")))
    assert os.listdir(mount.path("ns")) == []


def test_mv_onto_an_existing_file_replaces_it(mount: Mount) -> None:
    mount.path("mv-a").write_bytes(b"a")
    mount.path("mv-b").write_bytes(b"b")
    run("mv", "-T", str(mount.path("mv-a")), str(mount.path("mv-b")))
    assert mount.path("mv-b").read_bytes() == b"a" and not mount.path("mv-a").exists()


def test_symlink_link_and_mknod_fail_clearly(mount: Mount) -> None:
    mount.path("target").write_bytes(b"t")
    for call in (lambda: os.symlink("target", mount.path("sym")),
                 lambda: os.link(mount.path("target"), mount.path("hard")),
                 lambda: os.mkfifo(mount.path("fifo"))):
        with pytest.raises(OSError) as caught:
            call()
        assert caught.value.errno == errno.EOPNOTSUPP


def test_o_excl_create(mount: Mount) -> None:
    path = mount.path("excl")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.close(fd)
    with pytest.raises(FileExistsError):
        os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)


def test_fsync_of_a_directory_makes_its_new_files_durable(mount: Mount) -> None:
    """A create is durable with the journal's next sync (within the VD interval, 1 s by
    default); fsync of the directory runs that sync at once, as on a local file system."""
    (mount.mountpoint / "synced-dir").mkdir()
    syncs = metric(mount, "tierfs_journal_syncs_total")
    (mount.mountpoint / "synced-dir" / "new").touch()
    fd = os.open(mount.mountpoint / "synced-dir", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert metric(mount, "tierfs_journal_syncs_total") > syncs


def test_statfs_reports_sane_figures(mount: Mount) -> None:
    figures = os.statvfs(mount.mountpoint)
    disk = os.statvfs(mount.data_dir)
    assert figures.f_namemax == 255
    assert figures.f_blocks * figures.f_frsize == disk.f_blocks * disk.f_frsize
    assert 0 < figures.f_bavail <= figures.f_blocks


# ---------------------------------------------------------------- xattrs and durability
def test_getfattr_shows_the_segment_state(mount: Mount) -> None:
    path = mount.path("xattr.bin")
    path.write_bytes(b"z" * 3000)
    mount.client().op("flush", path="xattr.bin")
    dumped = run("getfattr", "-d", "--absolute-names", str(path)).stdout
    values = dict(line.split("=", 1) for line in dumped.splitlines() if "=" in line)
    assert values == {
        "user.tierfs.chunk_count": '"1"',
        "user.tierfs.durability": '"pd"',
        "user.tierfs.durable_length": '"3000"',
        "user.tierfs.flushed_length": '"3000"',
        "user.tierfs.offloaded_length": '"0"',
        "user.tierfs.sealed": '"false"',
    }
    failed = run("setfattr", "-n", "user.tierfs.durability", "-v", "vd", str(path), check=False)
    assert failed.returncode != 0  # only an empty segment may change its durability
    assert "Operation not permitted" in failed.stderr, failed.stderr
    failed = run("setfattr", "-n", "user.other", "-v", "x", str(path), check=False)
    assert failed.returncode != 0


def test_setfattr_chooses_vd_and_fsync_makes_it_durable(mount: Mount) -> None:
    path = mount.path("vd.log")
    path.touch()
    run("setfattr", "-n", "user.tierfs.durability", "-v", "vd", str(path))
    assert run("getfattr", "-n", "user.tierfs.durability", "--only-values", str(path)).stdout == "vd"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"volatile until fsync\n")
        os.fsync(fd)
        assert mount.client().stat("vd.log").durable_length == 21  # at once, not within 1 s
    finally:
        os.close(fd)


def test_setfattr_chooses_tier2_and_write_returns_once_in_tier2(mount: Mount) -> None:
    path = mount.path("tier2.log")
    path.touch()
    run("setfattr", "-n", "user.tierfs.durability", "-v", "tier2", str(path))
    assert run("getfattr", "-n", "user.tierfs.durability", "--only-values", str(path)).stdout == "tier2"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"in tier-2 when write returns\n")
        client = mount.client()
        assert client.stat("tier2.log").flushed_length == 29  # without fsync
        client.close()
    finally:
        os.close(fd)


# ---------------------------------------------------------------- front ends agree
def test_mount_and_fsspec_read_each_others_files(mount: Mount, tfs: TierFileSystem, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 17)
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    run("cp", str(source), str(mount.path("both-from-mount.bin")))
    with fsspec.open("tierfs://both-from-mount.bin", "rb") as f:
        assert f.read() == data
    tfs.pipe_file("both-from-fsspec.bin", data[::-1])
    assert mount.path("both-from-fsspec.bin").read_bytes() == data[::-1]
    with fsspec.open("tierfs://both-from-fsspec.bin", "ab") as f:
        f.write(b"tail")
    assert mount.path("both-from-fsspec.bin").read_bytes() == data[::-1] + b"tail"


# ---------------------------------------------------------------- errors
def test_every_engine_error_code_has_one_errno() -> None:
    from tierfs.fuse.errors import ERRNO_BY_CODE

    from tierfs.contracts.error_wire import all_error_classes

    assert set(all_error_classes()) <= set(ERRNO_BY_CODE)
    assert ERRNO_BY_CODE["bad_offset"] == ERRNO_BY_CODE["sealed"] == errno.EPERM


async def test_an_unexpected_exception_becomes_eio_and_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    import pyfuse3
    from tierfs.fuse.errors import fuse_errors

    from tierfs.contracts.errors import SegmentNotFoundError

    @fuse_errors
    async def broken() -> None:
        raise KeyError("a bug")

    @fuse_errors
    async def missing() -> None:
        raise SegmentNotFoundError("x")

    with pytest.raises(pyfuse3.FUSEError) as caught:
        await broken()
    assert caught.value.errno == errno.EIO
    assert "broken failed unexpectedly" in caplog.text and "a bug" in caplog.text
    with pytest.raises(pyfuse3.FUSEError) as caught:
        await missing()
    assert caught.value.errno == errno.ENOENT


# ---------------------------------------------------------------- lifecycle
def test_kill_9_leaves_no_hung_mount_and_restart_recovers_every_fsynced_byte(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    acknowledged: dict[str, bytes] = {"pd.log": b"", "vd.log": b""}
    mount.path("pd.log").touch()
    mount.path("vd.log").touch()
    run("setfattr", "-n", "user.tierfs.durability", "-v", "vd", str(mount.path("vd.log")))
    stop = threading.Event()

    def writer(name: str) -> None:
        fd = os.open(mount.path(name), os.O_WRONLY | os.O_APPEND)
        try:
            i = 0
            while not stop.is_set():
                record = f"{name} record {i:06d}\n".encode()
                os.write(fd, record)
                os.fsync(fd)
                acknowledged[name] += record  # only after fsync returned
                i += 1
        except OSError:
            pass  # the daemon died under us
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    threads = [threading.Thread(target=writer, args=(name,)) for name in acknowledged]
    for t in threads:
        t.start()
    time.sleep(1.0)
    mount.kill9()
    stop.set()
    for t in threads:
        t.join(timeout=WAIT_S)
        assert not t.is_alive(), "a writer hung on the dead mount"
    deadline = time.monotonic() + WAIT_S
    while is_mount_point(mount.mountpoint):  # auto_unmount's helper cleans up
        assert time.monotonic() < deadline, f"kill -9 left the mount behind; {_unmount_helpers(mount.mountpoint)}"
        time.sleep(0.05)
    run("ls", str(mount.mountpoint))  # does not hang
    assert all(len(data) > 0 for data in acknowledged.values())

    again = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        for name, data in acknowledged.items():
            got = again.path(name).read_bytes()
            assert got[: len(data)] == data, f"{name}: acknowledged bytes lost"
            assert got.endswith(b"\n") or not got  # whole records only
    finally:
        code, stderr = again.unmount()
        assert code == 0, stderr


def _unmount_helpers(mountpoint: Path) -> str:
    """What a failure needs to say: the processes naming the mount point (fusermount3's
    auto_unmount helper waits for every copy of the daemon's end of its socket to close)
    and their state."""
    found = []
    for pid, _, raw in processes():
        command = raw.replace(b"\0", b" ").decode(errors="replace")
        if str(mountpoint) not in command:
            continue
        try:
            state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        found.append(f"pid {pid} {state.split(None, 1)[1]}: {command.strip()}")
    return "processes naming the mount point: " + ("; ".join(found) or "none")


def test_background_mount_and_umount(tmp_path: Path) -> None:
    data_dir, mountpoint = tmp_path / "data", tmp_path / "mnt"
    mountpoint.mkdir()
    cli = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir)]
    started = run(*cli, "mount", str(mountpoint), check=False)
    assert started.returncode == 0, started.stderr
    try:
        assert is_mount_point(mountpoint)
        (mountpoint / "bg.txt").write_bytes(b"background")
        again = run(*cli, "mount", str(tmp_path), check=False)  # same data dir: refused
        assert again.returncode != 0
        assert run(*cli, "cat", "bg.txt").stdout == "background"  # the API serves beside it
    finally:
        run(*cli, "umount", str(mountpoint))
    deadline = time.monotonic() + WAIT_S
    while (data_dir / "tierfs.sock").exists():  # the daemon closes and exits
        assert time.monotonic() < deadline, "the daemon did not exit after umount"
        time.sleep(0.05)
    assert not is_mount_point(mountpoint)
    assert run(*cli, "cat", "bg.txt").stdout == "background"


def test_mount_refuses_a_missing_mount_point(tmp_path: Path) -> None:
    result = run(sys.executable, "-m", "tierfs.cli", "--data-dir", str(tmp_path / "d"), "mount",
                 str(tmp_path / "nope"), check=False)
    assert result.returncode == 1 and "does not exist" in result.stderr and "mkdir -p" in result.stderr


def _mounted_in_background(tmp_path: Path) -> tuple[Path, list[str], int]:
    """``tierfs mount`` as a user types it: the mount point, the CLI for its data dir
    and the daemon's pid."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(tmp_path / "data")]
    started = run(*cli, "mount", str(mountpoint), check=False)
    assert started.returncode == 0, started.stderr
    return mountpoint, cli, int(started.stderr.split("(pid ", 1)[1].split(",", 1)[0].rstrip(")"))


def test_mount_detaches_a_dead_tierfs_mount_at_its_mount_point_and_says_so(tmp_path: Path) -> None:
    mountpoint, cli, pid = _mounted_in_background(tmp_path)
    (mountpoint / "kept").write_bytes(b"fsynced")
    # libfuse's auto-unmount helper and tierfs's unmount guard die first, then the
    # daemon: nothing unmounts
    helpers = [other for other, _, command in processes() if other != pid and os.fsencode(mountpoint) in command]
    assert len(helpers) == 2, helpers
    for helper in helpers:
        os.kill(helper, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while process_running(pid):
        assert time.monotonic() < deadline, "the killed daemon did not exit"
        time.sleep(0.05)
    try:
        with pytest.raises(OSError) as dead:
            os.stat(mountpoint)
        assert dead.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        again = run(*cli, "mount", str(mountpoint), check=False)
        assert again.returncode == 0, again.stderr
        assert f"detached a dead tierfs mount at {mountpoint}" in again.stderr
        assert (mountpoint / "kept").read_bytes() == b"fsynced"
    finally:
        run(*cli, "umount", str(mountpoint), check=False)
        if is_mount_point(mountpoint):  # the dead one, where detaching failed
            run("fusermount3", "-u", "-z", str(mountpoint), check=False)



def test_a_files_inode_number_is_its_identity_across_renames_and_restarts(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    cli = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(mount.data_dir)]
    try:
        mount.path("d").mkdir()
        inodes = set()
        for attempt in range(20):
            run("touch", str(mount.path(f"a{attempt}")))
            before = os.stat(mount.path(f"a{attempt}")).st_ino
            run("mv", str(mount.path(f"a{attempt}")), str(mount.path(f"d/b{attempt}")))
            assert os.stat(mount.path(f"d/b{attempt}")).st_ino == before
            inodes.add(before)
        assert len(inodes) == 20  # and every file its own
        kept = os.stat(mount.path("d/b0")).st_ino
        run(*cli, "mv", "d/b0", "moved-by-the-cli")  # renamed elsewhere: the inode follows it
        deadline = time.monotonic() + WAIT_S
        while not mount.path("moved-by-the-cli").exists():  # the kernel's entry cache lets go
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert os.stat(mount.path("moved-by-the-cli")).st_ino == kept
    finally:
        code, stderr = mount.unmount()
        assert code == 0, stderr
    again = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        assert os.stat(again.path("moved-by-the-cli")).st_ino == kept  # and across a restart
        assert {os.stat(again.path(f"d/b{i}")).st_ino for i in range(1, 20)} <= inodes
    finally:
        code, stderr = again.unmount()
        assert code == 0, stderr


@pytest.mark.slow
def test_thirty_kill_9s_of_the_mount_daemon_leave_no_mount(tmp_path: Path) -> None:
    for attempt in range(30):
        mountpoint, cli, pid = _mounted_in_background(tmp_path)
        with open(mountpoint / "log", "ab") as f:
            f.write(b"%d\n" % attempt)
        run("ls", "-la", str(mountpoint))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while is_mount_point(mountpoint) or process_running(pid):
            assert time.monotonic() < deadline, f"run {attempt}: {_unmount_helpers(mountpoint)}"
            time.sleep(0.05)
    assert run(*cli, "cat", "log").stdout == "".join(f"{i}\n" for i in range(30))
