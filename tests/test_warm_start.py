"""The harness's warm start: a forked ``tierfs`` process is what a new interpreter
would be (its streams, environment, directory, exit codes and signals), and anything
a fork cannot carry runs as a new interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierfs.testing import warm_start
from tierfs.testing.harness import start_daemon

CLI = [sys.executable, "-m", "tierfs.cli"]


@pytest.fixture(autouse=True)
def _enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(warm_start.ENABLE_VARIABLE, "1")


def _run(argv: list[str], tmp_path: Path, **env: str) -> tuple[object, int, bytes, bytes]:
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = warm_start.start(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr)
        code = proc.wait(timeout=60)
    return proc, code, out.read_bytes(), err.read_bytes()


def test_a_forked_command_prints_and_exits_as_a_new_interpreter(tmp_path: Path) -> None:
    for argv in (["--version"], ["--data-dir", str(tmp_path / "d"), "stat", "nothing/here"], ["nonsense"]):
        fresh = subprocess.run([*CLI, *argv], capture_output=True, timeout=60)
        proc, code, out, err = _run([*CLI, *argv], tmp_path)
        assert isinstance(proc, warm_start.WarmProcess)
        assert (code, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr), argv
    for _ in range(20):  # exiting at once, before its caller has its pid: still run once
        _, code, out, err = _run([*CLI, "nonsense"], tmp_path)
        assert (code, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_forked_command_gets_its_own_environment_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative data dir in the environment: both must arrive
    for argv in (["create", "a"], ["append", "a", "x"]):
        proc, code, _, err = _run([*CLI, *argv], tmp_path, TIERFS_DATA_DIR="relative-data")
        assert isinstance(proc, warm_start.WarmProcess) and code == 0, err
    proc, code, out, _ = _run([*CLI, "--data-dir", str(tmp_path / "relative-data"), "cat", "a"], tmp_path)
    assert code == 0 and out == b"x"


def test_a_forked_daemon_stops_on_sigterm_and_dies_on_sigkill(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "data")
    assert isinstance(daemon.proc, warm_start.WarmProcess)
    assert Path(f"/proc/{daemon.pid}").exists() and daemon.proc.poll() is None
    code, stderr = daemon.stop()
    assert code == 0 and "flushed and closed" in stderr
    daemon = start_daemon(tmp_path / "data")
    os.kill(daemon.pid, signal.SIGSTOP)
    with pytest.raises(subprocess.TimeoutExpired):
        daemon.proc.wait(timeout=0.2)
    daemon.kill9()
    assert daemon.proc.returncode == -signal.SIGKILL
    daemon.proc.kill()  # after the exit: no signal goes anywhere (the pid may be reused)


def test_what_a_fork_cannot_carry_runs_as_a_new_interpreter(tmp_path: Path) -> None:
    proc, code, out, _ = _run([*CLI, "--version"], tmp_path, PYTHONHASHSEED="7")
    assert isinstance(proc, subprocess.Popen) and code == 0 and out
    piped = warm_start.start([*CLI, "--version"], env=dict(os.environ), stdout=subprocess.PIPE)
    assert isinstance(piped, subprocess.Popen)
    assert piped.communicate(timeout=60)[0] == out
    proc, code, _, _ = _run([sys.executable, "-c", "pass"], tmp_path)
    assert isinstance(proc, subprocess.Popen) and code == 0


def test_without_the_setting_every_process_is_a_new_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(warm_start.ENABLE_VARIABLE, "0")
    proc, code, _, _ = _run([*CLI, "--version"], tmp_path)
    assert isinstance(proc, subprocess.Popen) and code == 0


def test_the_server_ends_with_its_caller(tmp_path: Path) -> None:
    script = ("import os, subprocess, sys\n"
              "from tierfs.testing import warm_start\n"
              "p = warm_start.start([sys.executable, '-m', 'tierfs.cli', '--version'], env=dict(os.environ),"
              " stdout=subprocess.DEVNULL)\n"
              "assert p.wait(60) == 0\n"
              "print(warm_start._server.proc.pid, warm_start._server.directory)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, warm_start.ENABLE_VARIABLE: "1"})
    assert done.returncode == 0, done.stderr
    pid, directory = done.stdout.split()
    deadline = time.monotonic() + 30  # a failure bound: it ends as soon as the caller's pipe closes
    while Path(directory).exists():
        assert time.monotonic() < deadline, f"the warm-start server {pid} outlived its caller"
        time.sleep(0.02)


def test_a_server_that_cannot_start_is_tried_once_then_new_interpreters_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tries = []

    class Failing:
        def __init__(self) -> None:
            tries.append(1)
            raise OSError("no pidfds here")

    monkeypatch.setattr(warm_start, "_Server", Failing)
    monkeypatch.setattr(warm_start, "_server", None)
    monkeypatch.setattr(warm_start, "_unavailable_in", None)
    for _ in range(2):
        proc, code, out, _ = _run([*CLI, "--version"], tmp_path)
        assert isinstance(proc, subprocess.Popen) and code == 0 and out
    assert tries == [1]
