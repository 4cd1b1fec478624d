"""Real tools on a real mount (issue 17 items 1, 2 and 9): timestamps, modes and owners
that are kept, POSIX rename, and the tools that depend on them: ``touch -d`` + ``stat``,
``rsync -a`` twice, ``os.replace``, ``sed -i``, ``vim -es``, ``git``, ``chmod``/``chown``,
``tar -p``. What each of these needs is in docs/mount.md's "Tools on the mount" table.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tierfs.contracts.operations import FSCK
from tierfs.testing.harness import Mount

RELEASE_WITHIN_S = 60.0  # a failure bound only: the wait ends when the release is processed

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)


def run(*command: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload, no-any-return]


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is missing: ./dev.sh test installs it")


def test_touch_d_sets_times_and_stat_reads_them_back(mount: Mount) -> None:
    path = mount.path("touched")
    path.write_bytes(b"x")
    run("touch", "-d", "2021-03-04 05:06:07.123456789 UTC", str(path))
    assert run("stat", "-c", "%y", str(path)).stdout.startswith("2021-03-04 05:06:07.123456789")
    os.utime(path, ns=(1_600_000_000_000_000_001, 1_700_000_000_000_000_002))
    st = path.stat()
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_600_000_000_000_000_001, 1_700_000_000_000_000_002)
    before_ctime = st.st_ctime_ns
    run("touch", str(path))  # now
    assert abs(path.stat().st_mtime_ns - time.time_ns()) < 5_000_000_000
    assert path.stat().st_ctime_ns >= before_ctime


def test_mtime_is_stable_over_a_flush_and_a_restart(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        path = mount.path("log")
        with open(path, "ab") as f:
            f.write(b"line\n")
        first = path.stat().st_mtime_ns
        samples = {path.stat().st_mtime_ns for _ in range(20)}
        assert samples == {first}
        run(sys_executable(), "-m", "tierfs.cli", "--data-dir", str(mount.data_dir), "flush", "log")
        time.sleep(1.2)  # past the attribute timeout: the kernel asks again
        assert path.stat().st_mtime_ns == first
    finally:
        code, stderr = mount.unmount()
        assert code == 0, stderr
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        assert mount.path("log").stat().st_mtime_ns == first
    finally:
        mount.unmount()


def sys_executable() -> str:
    import sys

    return sys.executable


def test_directory_mtime_moves_with_entries_and_ls_shows_the_modes(mount: Mount) -> None:
    directory = mount.path("dirtimes")
    directory.mkdir()
    before = directory.stat().st_mtime_ns
    time.sleep(0.01)
    (directory / "a").write_bytes(b"")
    time.sleep(1.1)  # the kernel's attribute cache
    assert directory.stat().st_mtime_ns > before
    os.chmod(directory / "a", 0o600)
    os.chmod(directory, 0o750)
    listing = run("ls", "-la", str(directory)).stdout
    assert "-rw-------" in listing and " a\n" in listing
    assert (directory.stat().st_mode & 0o7777) == 0o750


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another owner takes root")
def test_chown_and_chmod_are_kept(mount: Mount) -> None:
    path = mount.path("owned")
    path.write_bytes(b"x")
    os.chown(path, 1234, 5678)
    os.chmod(path, 0o640)
    st = path.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o640)
    os.chmod(path, 0o440)  # no write bit: sealed
    with pytest.raises(PermissionError):
        with open(path, "ab") as f:
            f.write(b"y")
    os.chmod(path, 0)
    assert path.stat().st_mode & 0o7777 == 0  # not the default: mode 0 is a mode
    os.chmod(path, 0o640)
    with open(path, "ab") as f:
        f.write(b"y")
    assert path.read_bytes() == b"xy"
    fd = os.open(mount.path("read-only-from-birth"), os.O_CREAT | os.O_WRONLY, 0o444)
    assert os.fstat(fd).st_mode & 0o7777 == 0o444
    os.write(fd, b"git object")
    os.close(fd)
    assert mount.path("read-only-from-birth").stat().st_mode & 0o7777 == 0o444


def test_os_replace_replaces_atomically_and_open_handles_keep_reading(mount: Mount) -> None:
    target = mount.path("config.json")
    target.write_bytes(b'{"v": 1}')
    reader = open(target, "rb")
    try:
        temporary = mount.path("config.json.tmp")
        temporary.write_bytes(b'{"v": 2}')
        os.replace(temporary, target)
        assert target.read_bytes() == b'{"v": 2}'
        assert not temporary.exists()
    finally:
        reader.close()
    sealed = mount.path("sealed.txt")
    sealed.write_bytes(b"kept")
    os.chmod(sealed, 0o444)
    other = mount.path("other.txt")
    other.write_bytes(b"new")
    with pytest.raises(PermissionError):
        os.replace(other, sealed)
    assert sealed.read_bytes() == b"kept" and other.read_bytes() == b"new"


def test_rsync_a_twice_transfers_nothing_the_second_time(mount: Mount, tmp_path: Path) -> None:
    need("rsync")
    source = tmp_path / "tree"
    for index in range(30):
        (source / f"d{index % 3}").mkdir(parents=True, exist_ok=True)
        (source / f"d{index % 3}" / f"f{index}.txt").write_text(f"file {index}\n" * (index + 1))
    os.chmod(source / "d0" / "f0.txt", 0o600)
    destination = mount.path("rsynced")
    first = run("rsync", "-a", "--stats", f"{source}/", f"{destination}/").stdout
    assert "Number of regular files transferred: 30" in first, first
    second = run("rsync", "-a", "--stats", "--itemize-changes", f"{source}/", f"{destination}/").stdout
    assert "Number of regular files transferred: 0" in second, second
    assert run("diff", "-r", str(source), str(destination)).returncode == 0
    assert (destination / "d0" / "f0.txt").stat().st_mode & 0o7777 == 0o600
    src_mtime = (source / "d1" / "f1.txt").stat().st_mtime_ns
    assert (destination / "d1" / "f1.txt").stat().st_mtime_ns == src_mtime


def test_sed_i_edits_a_file_in_place(mount: Mount) -> None:
    path = mount.path("sed.txt")
    path.write_text("hello world\n")
    run("sed", "-i", "s/world/tierfs/", str(path))
    assert path.read_text() == "hello tierfs\n"


def rewritable(mount: Mount, name: str) -> Path:
    """A directory whose policy lets rewrites replace files (rewrite_replaces=1)."""
    directory = mount.path(name)
    directory.mkdir()
    run(sys_executable(), "-m", "tierfs.cli", "--data-dir", str(mount.data_dir),
        "policy", "set", name, "rewrite_replaces=1")
    return directory


def test_rewrites_are_refused_by_default_and_replace_under_the_policy(mount: Mount) -> None:
    recovered = mount.path("COMMIT_EDITMSG")  # git: refused, so it deletes and creates it again
    recovered.write_bytes(b"first\n")
    with pytest.raises(PermissionError):
        open(recovered, "wb").close()
    recovered.unlink()
    recovered.write_bytes(b"second\n")
    log_file = mount.path("app.log")
    log_file.write_bytes(b"appended\n")
    with pytest.raises(PermissionError):
        open(log_file, "wb").close()  # O_TRUNC: refused, nothing changed
    assert log_file.read_bytes() == b"appended\n"
    deadline = time.monotonic() + 60
    while "run: tierfs policy set / rewrite_replaces=1" not in mount.stderr_text():  # a refusal the user met
        assert time.monotonic() < deadline, "the refusal was never logged"
        time.sleep(0.1)
    assert "COMMIT_EDITMSG" not in mount.stderr_text()  # refused earlier, but worked around: no warning
    directory = rewritable(mount, "build")
    output = directory / "out.txt"
    output.write_bytes(b"version 1\n")
    os.chmod(output, 0o640)
    output.write_bytes(b"v2\n")  # O_TRUNC under the policy: a new segment under the name
    assert output.read_bytes() == b"v2\n"
    assert output.stat().st_mode & 0o7777 == 0o640
    with open(output, "r+b") as f:  # ftruncate(fd, 0) then write, as vim does
        f.truncate(0)
        f.write(b"v3\n")
    assert output.read_bytes() == b"v3\n"
    assert sorted(p.name for p in directory.iterdir()) == ["out.txt"]


def test_vim_ex_mode_writes_a_file(mount: Mount) -> None:
    need("vim")
    directory = rewritable(mount, "edits")
    path = directory / "vim.txt"
    path.write_text("first\n")
    time.sleep(1.1)  # vim compares mtimes: nothing may move them meanwhile
    # vim -es is Vi-compatible (backupcopy=yes): it truncates and rewrites in place.
    # -n: no swap file, which vim rewrites block by block (in place: refused by design)
    result = run("vim", "-es", "-n", "-c", "$put ='second'", "-c", "wq", str(path), check=False)
    assert result.returncode == 0, result.stderr
    assert path.read_text() == "first\nsecond\n"


def test_git_init_add_commit_log(mount: Mount) -> None:
    need("git")
    repo = mount.path("repo")
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(repo)}
    run("git", "init", "-q", str(repo), env=env)
    (repo / "README").write_text("hello\n")
    run("git", "-C", str(repo), "add", "README", env=env)
    run("git", "-C", str(repo), "commit", "-q", "-m", "first", env=env)
    (repo / "second").write_text("more\n")
    run("git", "-C", str(repo), "add", "second", env=env)
    run("git", "-C", str(repo), "commit", "-q", "-m", "second", env=env)
    log = run("git", "-C", str(repo), "log", "--format=%s", env=env).stdout
    assert log.split() == ["second", "first"]
    assert run("git", "-C", str(repo), "fsck", "--strict", env=env).returncode == 0
    assert run("git", "-C", str(repo), "status", "--porcelain", env=env).stdout == ""


def test_git_gc_repack_stash_and_pull_in_a_rewritable_directory(mount: Mount) -> None:
    """git writes packs read-only (sealed) and renames new ones over them: allowed where
    rewrite_replaces=1, each sealed pack itself unchanged."""
    need("git")
    base = rewritable(mount, "gitwork")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(base)}
    upstream, clone = base / "upstream", base / "clone"
    run("git", "init", "-q", str(upstream), env=env)
    for i in range(3):
        (upstream / f"f{i}").write_text(f"{i}\n")
        run("git", "-C", str(upstream), "add", ".", env=env)
        run("git", "-C", str(upstream), "commit", "-q", "-m", f"c{i}", env=env)
    for command in (["gc", "-q"], ["repack", "-adq"], ["gc", "-q", "--aggressive"], ["repack", "-adq"]):
        result = run("git", "-C", str(upstream), *command, env=env, check=False)
        assert result.returncode == 0, (command, result.stderr)
    run("git", "clone", "-q", str(upstream), str(clone), env=env)
    (upstream / "f0").write_text("changed upstream\n")
    run("git", "-C", str(upstream), "commit", "-qam", "c3", env=env)
    (clone / "f1").write_text("local change\n")
    run("git", "-C", str(clone), "stash", "-q", env=env)
    run("git", "-C", str(clone), "pull", "-q", "--no-rebase", env=env)
    run("git", "-C", str(clone), "stash", "pop", "-q", env=env)
    assert (clone / "f0").read_text() == "changed upstream\n" and (clone / "f1").read_text() == "local change\n"
    for repo in (upstream, clone):
        assert run("git", "-C", str(repo), "fsck", "--strict", env=env).returncode == 0


def test_tar_p_keeps_modes_and_times(mount: Mount, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "script.sh").write_text("#!/bin/sh\n")
    os.chmod(source / "script.sh", 0o750)
    os.utime(source / "script.sh", ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    archive = tmp_path / "a.tar"
    run("tar", "-cf", str(archive), "-C", str(source), "script.sh")
    destination = mount.path("untarred")
    destination.mkdir()
    run("tar", "-xpf", str(archive), "-C", str(destination))
    st = (destination / "script.sh").stat()
    assert st.st_mode & 0o7777 == 0o750
    assert st.st_mtime_ns == 1_500_000_000_000_000_000


def test_spark_builtin_writers_on_the_mount(mount: Mount, spark: Any) -> None:
    """df.write.json/parquet/csv to a directory on the mount, twice and overwrite, with
    the policy; without it the second write is refused at its start, before it changed
    anything (its commit would rewrite Hadoop's ._SUCCESS.crc)."""
    directory = rewritable(mount, "spark-out")
    df = spark.createDataFrame([(i, f"n{i}") for i in range(10)], ["id", "name"])
    for fmt in ("json", "parquet", "csv"):
        target = str(directory / fmt)
        getattr(df.write.mode("append"), fmt)(target)
        getattr(df.write.mode("append"), fmt)(target)
        assert spark.read.format(fmt).load(target).count() == 20, fmt
        getattr(df.write.mode("overwrite"), fmt)(target)
        assert spark.read.format(fmt).load(target).count() == 10, fmt
    plain = mount.path("spark-plain")
    plain.mkdir()
    df.write.mode("append").json(str(plain / "json"))
    before = sorted(os.listdir(plain / "json"))
    with pytest.raises(Exception, match="_temporary"):  # refused at the job's start
        df.write.mode("append").json(str(plain / "json"))
    assert "tierfs policy set spark-plain/json rewrite_replaces=1" in mount.stderr_text()
    assert sorted(os.listdir(plain / "json")) == before  # nothing changed: no duplicate rows
    assert spark.read.json(str(plain / "json")).count() == 10
    df.limit(4).write.mode("overwrite").json(str(plain / "json"))  # after a refused job: replaces all
    assert spark.read.json(str(plain / "json")).count() == 4
    # Hadoop leaves the refused job's _SUCCESS stream open until the JVM collects it:
    # collect it, or the mount could not be unmounted
    deadline = time.monotonic() + 30
    while open_files_below(mount.mountpoint) and time.monotonic() < deadline:
        spark.sparkContext._jvm.System.gc()
        time.sleep(0.2)
    assert open_files_below(mount.mountpoint) == []


def open_files_below(directory: Path) -> list[str]:
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            targets = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:
            continue  # the process ended, or is not ours to look at
        found += [t for t in targets if t.startswith(f"{directory}/")]
    return found


def test_the_readme_table_names_these_tests() -> None:
    """docs/mount.md's "Tools on the mount" table: every row names a test that exists,
    and every test here is in the table."""
    repo = Path(__file__).resolve().parent.parent
    guide = (repo / "docs" / "mount.md").read_text()
    section = guide.split("\n## Tools on the mount\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "| Test |" not in line]
    named = {name.strip("` ") for line in rows
             for name in line.rstrip(" |").rsplit("|", 1)[1].split("(")[0].split(",")}
    sources = "".join((repo / "tests" / f"test_{name}.py").read_text() for name in ("fuse_tools", "fuse", "fuse_identity"))
    defined = {name for name in named if f"def {name}(" in sources}
    assert named == defined, f"docs/mount.md names tests that do not exist: {named - defined}"
    here = {line.split("(")[0][4:] for line in Path(__file__).read_text().splitlines()
            if line.startswith("def test_") and "readme" not in line}
    assert here <= named, f"tests missing from docs/mount.md's table: {here - named}"


def test_ls_la_shows_dot_entries_and_nlink_counts_subdirectories(mount: Mount) -> None:
    directory = mount.path("links")
    for sub in ("a", "b", "c"):
        (directory / sub).mkdir(parents=True)
    (directory / "file").write_bytes(b"x")
    listing = run("ls", "-la", str(directory)).stdout.splitlines()
    assert [line.split()[-1] for line in listing[1:3]] == [".", ".."]
    assert run("stat", "-c", "%h", str(directory)).stdout.strip() == "5"
    os.rmdir(directory / "c")
    assert os.stat(directory).st_nlink == 4


def test_name_length_limits_are_the_kernels(mount: Mount, tmp_path: Path) -> None:
    directory = mount.path("names")
    directory.mkdir()
    (directory / ("a" * 255)).write_bytes(b"ok")
    with pytest.raises(OSError) as refused:
        (directory / ("b" * 256)).write_bytes(b"no")
    assert refused.value.errno == errno.ENAMETOOLONG
    with pytest.raises(OSError) as refused_dir:
        os.mkdir(directory / ("c" * 256))
    assert refused_dir.value.errno == errno.ENAMETOOLONG
    # deeper than 4,096 bytes below the mount root, reached by relative paths (the
    # kernel counts PATH_MAX on the path each call is given)
    component = "d" * 200
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(25):  # 25 * 201 bytes: over 4,096 below the mount root
            os.mkdir(component, dir_fd=fd)
            deeper = os.open(component, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        file_fd = os.open("deep.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(file_fd, b"deep")
        os.close(file_fd)
    finally:
        os.close(fd)
    deep_name = "names/" + "/".join([component] * 25) + "/deep.txt"
    info = run(sys_executable(), "-m", "tierfs.cli", "--data-dir", str(mount.data_dir), "stat", deep_name)
    assert "length" in info.stdout and " 4" in info.stdout
    cli = run(sys_executable(), "-m", "tierfs.cli", "--data-dir", str(mount.data_dir), "create",
              "names/" + "e" * 256, check=False)
    assert cli.returncode != 0 and "component longer than 255 bytes" in cli.stderr, cli


def test_a_file_unlinked_while_open_keeps_working_through_its_descriptor(mount: Mount) -> None:
    path = mount.path("rotating.log")
    path.write_bytes(b"before\n")
    segments = mount.client().call(FSCK).segments
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        os.unlink(path)
        assert not path.exists()
        listed = run("ls", "-A", str(mount.mountpoint)).stdout.split("\n")
        assert "rotating.log" not in listed and not any("detached" in name for name in listed)
        assert os.pread(fd, 100, 0) == b"before\n"
        os.write(fd, b"after\n")
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"before\nafter\n"
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink) == (13, 0)
        path.write_bytes(b"a new file under the old name\n")  # log rotation: a new file
        assert os.pread(fd, 100, 0) == b"before\nafter\n"
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a new file under the old name\n"
    # the old file goes at its last close: the kernel sends that release after close()
    # returned, so the count is awaited (it changes once, and never back)
    client = mount.client()
    try:
        deadline_s = time.monotonic() + RELEASE_WITHIN_S
        while client.call(FSCK).segments != segments and time.monotonic() < deadline_s:
            time.sleep(0.05)
        assert client.call(FSCK).segments == segments
    finally:
        client.close()


def test_tail_f_follows_the_old_file_across_a_rotation(mount: Mount) -> None:
    path = mount.path("rotated.log")
    path.write_bytes(b"one\n")
    follower = subprocess.Popen(["tail", "-f", str(path)], stdout=subprocess.PIPE)
    try:
        time.sleep(0.5)
        with open(path, "ab") as f:
            rotated = mount.path("rotated.log.1")
            os.rename(path, rotated)
            f.write(b"two\n")
        time.sleep(1.5)
        os.unlink(rotated)
        time.sleep(0.5)
    finally:
        follower.terminate()
        output = follower.communicate(timeout=10)[0]
    assert output == b"one\ntwo\n"


def test_unlinked_open_files_are_gone_after_a_kill_9(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    holder = None
    try:
        path = mount.path("held")
        path.write_bytes(b"x")
        holder = subprocess.Popen(["sleep", "600"], stdin=open(path, "rb"))
        os.unlink(path)
        names_before = [i.name for i in mount.client().ls("")]
        assert names_before == []
        mount.proc.kill()  # kill -9 of the daemon with the mount
        mount.proc.wait(timeout=30)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    deadline = time.monotonic() + 30
    while is_mounted(mount.mountpoint):
        assert time.monotonic() < deadline, "kill -9 left the mount behind"
        time.sleep(0.1)
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        statistics = run(sys_executable(), "-m", "tierfs.cli", "--data-dir", str(mount.data_dir),
                         "ls", "-l", "").stdout
        assert statistics.strip() == ""
        assert "deleted while open" in mount.stderr_text()
    finally:
        mount.unmount()


def is_mounted(path: Path) -> bool:
    from tierfs.fuse.mount import is_mount_point

    return is_mount_point(path)


def test_allow_other_is_opt_in_and_the_kernel_checks_the_stored_modes(tmp_path: Path) -> None:
    """Other users: refused by the kernel on a default mount; with --allow-other they
    get what the stored mode and owner give them (default_permissions)."""
    if os.getuid() != 0:
        pytest.skip("becomes another user (runuser): root, as CI runs")
    if shutil.which("runuser") is None:
        pytest.fail("this test runs as root with runuser (util-linux), as CI does")
    base = Path("/tmp") / f"tierfs-other-{os.getpid()}"  # reachable by nobody (tmp_path may not be)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    try:
        for allow_other in (False, True):
            mount = Mount(base / f"data{int(allow_other)}", base / "mnt", *(["--allow-other"] if allow_other else []))
            try:
                os.chmod(mount.mountpoint, 0o755)
                (mount.path("public")).write_bytes(b"for everyone\n")
                (mount.path("private")).write_bytes(b"root only\n")
                os.chmod(mount.path("private"), 0o600)
                options = next(line for line in Path("/proc/self/mounts").read_text().splitlines()
                               if str(mount.mountpoint) in line)
                assert ("allow_other" in options) == allow_other, options
                if allow_other:
                    assert cat_as_nobody(mount.path("public")).stdout == "for everyone\n"
                    assert "Permission denied" in cat_as_nobody(mount.path("private")).stderr
                else:
                    assert "Permission denied" in cat_as_nobody(mount.path("public")).stderr
            finally:
                mount.unmount()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cat_as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    return run("runuser", "-u", "nobody", "--", "cat", str(path), check=False)
