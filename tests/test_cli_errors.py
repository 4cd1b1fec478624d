"""Every failure a user can provoke from the CLI, the mount command, the daemon start,
fsspec and the Spark source ends in one line naming the cause and the fix, with the
documented exit code (``tierfs --help``): never a traceback, an exception group or a
trio/hypercorn frame. Each test provokes one for real: in a process where the process
is the point (locks between processes, daemons, mounts, signals, a terminal), otherwise
in this one (``here``: the same command, its exit code and its stderr)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tierfs.testing.cli_runner import run_tierfs_text as here
from tierfs.testing.harness import Daemon, free_port, start_daemon

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
RAW_ERROR_MARKS = ("Traceback", "ExceptionGroup", "Exceptions from Trio", "sub-exception", "trio.", "hypercorn")


def tierfs(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout_s, stdin=subprocess.DEVNULL)


WAIT_NOTICES = ("still opening", "waiting up to")  # what a wait over 2 s says before its outcome


def assert_one_line(result: subprocess.CompletedProcess[str], exit_code: int, *needles: str) -> str:
    """The command failed with ``exit_code`` and one line on stderr holding ``needles``
    (after the notices of a long wait, which a loaded machine may cause)."""
    lines = [line for line in result.stderr.strip().splitlines() if not any(n in line for n in WAIT_NOTICES)]
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tierfs"), lines
    assert not any(mark in result.stderr for mark in RAW_ERROR_MARKS), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def serving(tmp_path: Path) -> Any:
    daemon = start_daemon(tmp_path / "data", verbose=False)
    yield daemon
    daemon.stop()


def test_a_second_daemon_on_a_data_dir_in_use_exits_4(serving: Daemon) -> None:
    result = tierfs("--data-dir", str(serving.data_dir), "serve")
    assert_one_line(result, 4, f"in use by pid {serving.pid}", "stop it first")


def _hold_data_dir(data_dir: Path, seconds: float) -> subprocess.Popen[str]:
    """A process holding the data dir's lock for ``seconds`` (a command run in-process),
    returned once it holds it."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from tierfs.engine.ownership.dir_lock import DataDirLock\n"
        f"lock = DataDirLock(Path({str(data_dir)!r})); lock.acquire(); print('held', flush=True)\n"
        f"time.sleep({seconds}); lock.release()")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_serve_typed_while_a_command_has_the_data_dir_in_process_waits_for_it(tmp_path: Path) -> None:
    """``tierfs append ...; tierfs serve &`` in quick succession: the command opened the
    store in-process (no daemon yet); serve waits for it to end instead of failing."""
    data_dir = tmp_path / "data"
    holder = _hold_data_dir(data_dir, 1.5)
    daemon = start_daemon(data_dir, verbose=False)
    try:
        assert holder.wait(timeout=30) == 0
        client = daemon.client()
        client.create("after-the-wait")
        client.close()
    finally:
        daemon.stop()


def test_a_command_waiting_for_another_holder_says_so_and_goes_on_when_it_ends(tmp_path: Path) -> None:
    """``tierfs tail -f`` without a daemon holds the data dir: another command waits,
    saying for what, and runs once the holder is gone (here after 3.5 s)."""
    data_dir = tmp_path / "data"
    holder = _hold_data_dir(data_dir, 3.5)
    result = tierfs("--data-dir", str(data_dir), "create", "after-the-holder")
    assert holder.wait(timeout=30) == 0
    assert result.returncode == 0, result.stderr
    assert f"waiting up to 30 s for pid {holder.pid} (" in result.stderr and "Ctrl-C to stop" in result.stderr


def test_the_in_use_line_says_whether_a_daemon_or_a_command_holds_it(tmp_path: Path) -> None:
    from tierfs.cli.failures import describe
    from tierfs.contracts.datadir import socket_path
    from tierfs.contracts.errors import StoreInUseError

    line = describe(StoreInUseError(str(tmp_path), 4242)).line
    assert "in use by pid 4242" in line and "a tierfs command has it open without a daemon" in line
    socket_path(tmp_path).touch()
    line = describe(StoreInUseError(str(tmp_path), 4242)).line
    assert "a tierfs daemon serves it" in line and "stop it first" in line


@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
@pytest.mark.parametrize("foreground", [False, True])
def test_mount_while_serve_owns_the_data_dir_exits_4(serving: Daemon, tmp_path: Path, foreground: bool) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    args = ["mount", str(mountpoint)] + (["--foreground"] if foreground else [])
    result = tierfs("--data-dir", str(serving.data_dir), *args)
    assert_one_line(result, 4, f"in use by pid {serving.pid}")
    assert not os.path.ismount(mountpoint)


@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
def test_a_mount_daemon_that_fails_after_forking_reports_one_line(tmp_path: Path) -> None:
    """The background child fails while starting (here tier-2 is unreachable): the
    parent prints the child's one line and exits with its code; the log keeps the rest."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = tierfs(*_unreachable_s3(tmp_path), "--data-dir", str(tmp_path / "d"), "mount", str(mountpoint),
                    env=_credentials())
    assert_one_line(result, 1, "tier-2", "check that tier-2 is reachable", "(tier2)")
    assert not os.path.ismount(mountpoint)
    assert "Traceback" in (tmp_path / "d" / "tierfs.log").read_text()  # the whole story is in the log


def test_the_daemon_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tierfs("--data-dir", str(tmp_path / "d"), "serve", "--listen", f"127.0.0.1:{port}")
    assert_one_line(result, 1, "cannot listen", "in use", "--listen")


def _credentials() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}


def _unreachable_s3(tmp_path: Path) -> list[str]:
    """Flags of a tier-2 on an S3 endpoint nothing listens on (botocore asked to try
    once, so the test takes seconds, not tierfs's retries times botocore's)."""
    config = tmp_path / "fast.toml"
    config.write_text("[tier2_options]\nconfig_kwargs = {retries = {max_attempts = 1}, connect_timeout = 1}\n")
    return ["--config", str(config), "--tier2", "s3://bucket/t2",
            "--tier2-endpoint-url", f"http://127.0.0.1:{free_port()}"]


def test_the_daemon_names_an_unreachable_s3_at_start(tmp_path: Path) -> None:
    result = tierfs(*_unreachable_s3(tmp_path), "--data-dir", str(tmp_path / "d"), "serve", env=_credentials())
    assert_one_line(result, 1, "tier-2", "--tier2-endpoint-url", "(tier2)")


def test_waiting_for_an_unanswering_tier2_says_so_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    command = [sys.executable, "-m", "tierfs.cli", *_unreachable_s3(tmp_path), "--data-dir", str(tmp_path / "d"), "ls"]
    command[command.index("--tier2-endpoint-url") + 1] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    # Ctrl-C as in a terminal: a suite started in the background (`./dev.sh test &`) runs
    # with SIGINT ignored, and a child inherits that unless it is set back
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, **_credentials()},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "still opening" in line and "waiting for tier-2 (s3://bucket/t2)" in line and "Ctrl-C" in line, line
        proc.send_signal(signal.SIGINT)
        try:
            _, rest = proc.communicate(timeout=120)  # drained: a full pipe must not hold it
        except subprocess.TimeoutExpired:
            proc.kill()
            _, rest = proc.communicate()
            raise AssertionError(f"Ctrl-C did not stop it within 120 s; it wrote {rest[-3000:]!r}") from None
        assert proc.returncode == 130, rest
    finally:
        proc.kill()
        proc.wait()
        silent.close()


def test_no_permission_on_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    assert tierfs("--data-dir", str(data_dir), "mkdir", "x").returncode == 0  # 0700, this user's
    data_dir.chmod(0)
    argv = ["--data-dir", str(data_dir), "ls"]
    try:
        if os.getuid() == 0:
            # root reads everything: the same root without the capabilities that override
            # file modes (so the checkout's .venv stays readable even in a 0700 home)
            if shutil.which("setpriv") is None:
                pytest.skip("as root this needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
            result = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                                     sys.executable, "-m", "tierfs.cli", *argv],
                                    capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        else:
            result = tierfs(*argv)
    finally:
        data_dir.chmod(0o700)
    assert_one_line(result, 1, "Permission denied", str(data_dir), "run as the user who owns it")


@pytest.mark.parametrize("args, needle", [
    (["cat", "x", "--length", "-5"], "--length: -5 is negative"),
    (["cat", "x", "--offset", "5x"], "--offset: '5x' is not a whole number of bytes or a size"),
    (["--deletion-lag", "soon", "ls"], "--deletion-lag: 'soon' is not a duration"),
    (["ls", "--durability", "fast"], "invalid choice: 'fast'"),
    (["mount", "m", "--attr-timeout", "-1s"], "--attr-timeout"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["policy", "set"], "required"),
])
def test_bad_flag_values_are_usage_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    line = assert_one_line(here("--data-dir", str(tmp_path / "d"), *args), 2, needle)
    assert "usage: tierfs" in line
    assert not (tmp_path / "d").exists()  # refused before anything was opened


@pytest.mark.parametrize("setting, env, needle, code", [
    # typed on the command line: a usage error, as --help says
    (["policy", "set", "/", "retention_s=soon"], {}, "retention_s: 'soon' is not a duration", 2),
    (["policy", "set", "/", "offload_hot_bytes=lots"], {}, "'lots' is not a whole number of bytes or a size", 2),
    (["ls"], {"TIERFS_FLUSH_BYTES": "lots"}, "flush_bytes: 'lots' is not a whole number of bytes", 1),
    (["ls"], {"TIERFS_FLUSH_INTERVAL_S": "-1s"}, "flush_interval_s", 1),
])
def test_bad_setting_values_name_the_setting(tmp_path: Path, setting: list[str], env: dict[str, str],
                                             needle: str, code: int) -> None:
    result = here("--data-dir", str(tmp_path / "d"), *setting, env=env)
    assert_one_line(result, code, needle, "usage: tierfs" if code == 2 else "(invalid_argument)")


@pytest.mark.parametrize("prepare, needle", [
    (lambda m: None, "does not exist (create it first: mkdir -p"),
    (lambda m: (m.mkdir(), (m / "x").write_text("x")), "is not empty"),
    (lambda m: m.write_text("a file"), "is not a directory"),
])
def test_bad_mount_points_are_refused_before_anything_starts(tmp_path: Path, prepare: Any, needle: str) -> None:
    mountpoint = tmp_path / "mnt"
    prepare(mountpoint)
    result = tierfs("--data-dir", str(tmp_path / "d"), "mount", str(mountpoint))
    assert_one_line(result, 1, needle)
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("unshare") is None,
                    reason="hides /dev/fuse in a mount namespace of its own: needs root and unshare")
def test_mount_without_dev_fuse_says_how_to_get_it(tmp_path: Path) -> None:
    """/dev/fuse hidden (a tmpfs over /dev in a private mount namespace, with only
    /dev/null in it); the machine's own /dev is untouched."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    command = " ".join([sys.executable, "-m", "tierfs.cli", "--data-dir", str(tmp_path / "d"), "mount",
                        str(mountpoint)])
    script = f"mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 && exec {command}"
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if "mount: " in result.stderr and "tierfs" not in result.stderr:
        pytest.skip(f"this sandbox does not allow a tmpfs over /dev: {result.stderr.strip()}")
    assert_one_line(result, 1, "/dev/fuse is missing", "modprobe fuse", "--device /dev/fuse")


@pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
def test_mount_on_a_mount_point_in_use_and_umount_of_a_plain_directory(tmp_path: Path) -> None:
    mountpoint, data_dir = tmp_path / "mnt", tmp_path / "d"
    mountpoint.mkdir()
    started = tierfs("--data-dir", str(data_dir), "mount", str(mountpoint))
    assert started.returncode == 0, started.stderr
    try:
        assert started.stderr.startswith(f"tierfs: mounted {data_dir} at {mountpoint} (pid ")
        again = tierfs("--data-dir", str(tmp_path / "other"), "mount", str(mountpoint))
        assert_one_line(again, 1, "already a mount point", f"tierfs umount {mountpoint}")
    finally:
        stopped = tierfs("umount", str(mountpoint))
    assert stopped.returncode == 0, stopped.stderr
    assert "flushed, closed" in stopped.stderr and "and exited" in stopped.stderr
    assert_one_line(tierfs("umount", str(mountpoint)), 1, "is not a tierfs mount point")


def test_no_daemon_at_a_url(tmp_path: Path) -> None:
    result = here("ls", "--url", f"http://127.0.0.1:{free_port()}")
    assert_one_line(result, 1, "no tierfs daemon at", "start one: tierfs serve", "(unavailable)")


def test_a_daemon_url_or_listen_address_without_its_parts_is_a_usage_error(tmp_path: Path) -> None:
    assert_one_line(here("--url", "localhost:6470", "ls"), 2, "no scheme", "did you mean http://localhost:6470")
    assert_one_line(here("ls", env={"TIERFS_URL": "127.0.0.1:6470"}), 1, "did you mean http://127.0.0.1:6470")
    for listen in ("127.0.0.1", "127.0.0.1:abc", "127.0.0.1:70000", ":7070"):
        result = here("--data-dir", str(tmp_path / "d"), "serve", "--listen", listen)
        assert_one_line(result, 2, "expected HOST:PORT", "e.g. 127.0.0.1:7070")
    assert not (tmp_path / "d").exists()


def test_a_wrong_token_says_where_the_token_is(tmp_path: Path) -> None:
    port = free_port()
    daemon = start_daemon(tmp_path / "data", "--listen", f"127.0.0.1:{port}", verbose=False)
    try:
        result = here("ls", "--url", f"http://127.0.0.1:{port}", env={"TIERFS_TOKEN": "wrong"})
        assert_one_line(result, 1, "wrong bearer token", "'token' in its data dir", "TIERFS_TOKEN", "(unauthorized)")
    finally:
        daemon.stop()


def test_what_a_newcomer_types_wrong_gets_the_fix(tmp_path: Path) -> None:
    d = str(tmp_path / "d")
    assert_one_line(here("--data-dir", d, "create", "a/b/c"), 1, "parent directory does not exist",
                    "tierfs create -p")
    assert_one_line(here("--data-dir", d, "mkdir", "a/b/c"), 1, "tierfs mkdir -p")
    assert_one_line(here("--data-dir", "", "ls"), 2, "--data-dir: is empty")
    assert_one_line(here("--data-dir", __file__, "ls"), 2, "is a file, not a directory")
    assert_one_line(here("--data-dir", d, "policy", "set", "/", "retention_bytes=lots"), 2, "'lots'")
    assert_one_line(here("--data-dir", d, "tail", "--follow=bogus", "x"), 2, "does not take the value 'bogus'")
    assert here("--data-dir", d, "create", "x").returncode == 0
    assert here("--data-dir", d, "append", "x", "y" * 1536).returncode == 0
    assert here("--data-dir", d, "ls", "-la").stdout.split() == ["-", "1536", "-p", "1", "x"]
    assert here("--data-dir", d, "ls", "-lh").stdout.split() == ["-", "1.5K", "-p", "1", "x"]


def test_append_from_a_terminal_says_how_to_end_the_record(tmp_path: Path) -> None:
    import pty

    leader, follower = pty.openpty()
    d = str(tmp_path / "d")
    assert tierfs("--data-dir", d, "create", "typed").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "tierfs.cli", "--data-dir", d, "append", "typed"],
                            stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(follower)
    os.write(leader, b"hello\n\x04")  # a line, then Ctrl-D
    out, err = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0 and out.strip() == "0", (out, err)
    assert "end it with Ctrl-D" in err
    assert tierfs("--data-dir", d, "cat", "typed").stdout == "hello\n"


def test_json_errors_are_one_json_line(tmp_path: Path) -> None:
    import json

    result = here("--data-dir", str(tmp_path / "d"), "cat", "missing", "--json")
    assert result.returncode == 1
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "not_found" and error["exit_code"] == 1 and "missing" in error["message"]


def test_verbose_adds_the_traceback(tmp_path: Path) -> None:
    result = here("--data-dir", str(tmp_path / "d"), "-v", "cat", "missing")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "tierfs: no such segment or directory: 'missing' (not_found)"


def test_fsspec_without_a_daemon_names_the_fix(tmp_path: Path) -> None:
    import fsspec

    from tierfs.contracts.errors import DaemonUnavailableError

    with pytest.raises(DaemonUnavailableError) as raised:
        fsspec.open("tierfs://x", "rb", data_dir=str(tmp_path / "nobody")).open()
    message = str(raised.value)
    assert "\n" not in message and "start one: tierfs serve" in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no chained httpx story


def test_spark_source_without_a_daemon_names_the_fix(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(Exception) as raised:
        spark.read.format("tierfs").option("data_dir", str(tmp_path / "nobody")).load("tierfs://x").collect()
    assert "no tierfs daemon at" in str(raised.value) and "start one: tierfs serve" in str(raised.value)
