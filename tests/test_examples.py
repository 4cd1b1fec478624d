"""The example pipelines work end to end and check their own figures (exit 1 on any
difference): ``./dev.sh demo``'s (three producer programs through fsspec, the mount and
the CLI, the streaming job, offload to S3 with the CLI, the batch job over the offloaded
history) and the cluster one (three daemons, a Spark standalone cluster, a failover)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tierfs.testing.harness import processes

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
def test_the_example_pipeline_runs_and_checks_out(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "pipeline.py"), str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[pipeline] OK: the history holds all" in done.stdout
    assert "the daemon fetched 0 blocks" in done.stdout  # executors read S3 themselves
    if Path("/dev/fuse").exists():
        assert "mounted at" in done.stdout and "/mnt/events/mobile" in done.stdout  # the log producer's file


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
def test_the_cluster_pipeline_runs_on_a_spark_standalone_cluster(postgres_server: object) -> None:
    """Three tierfs daemons on PostgreSQL + moto S3, a Spark master and two workers as
    processes: the job's answer is right, executors read the chunks from S3 themselves,
    and it is right again after one daemon is killed."""
    del postgres_server  # proves PostgreSQL is installed; the example starts its own
    work = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))  # short: Unix sockets live below it
    try:
        done = subprocess.run([sys.executable, str(REPO / "examples" / "cluster_pipeline.py"), str(work / "w")],
                              capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cluster pipeline OK" in done.stdout
    assert "the daemons fetched 0 blocks from tier-2" in done.stdout
    assert "per kind after failover" in done.stdout


@pytest.mark.parametrize("fuse", ["mount", "no FUSE"])
def test_a_failing_pipeline_stops_what_it_started(tmp_path: Path, fuse: str) -> None:
    """Spark cannot start (no Java where JAVA_HOME points): the pipeline fails, and its
    mount (or, where FUSE does not work, its daemon) is gone when it exits."""
    work = tmp_path / "work"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    command = [sys.executable, str(REPO / "examples" / "pipeline.py"), str(work)]
    if fuse == "no FUSE":  # /dev/fuse masked in a mount namespace of its own: the mount fails
        if os.getuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("masks /dev/fuse in a mount namespace: needs root and unshare")
        command = ["unshare", "-m", "sh", "-c", 'mount --bind /dev/null /dev/fuse && exec "$@"', "sh", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert "the streaming job did not start" in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    if fuse == "no FUSE":
        assert "no FUSE here: serving without a mount" in done.stdout
    assert str(work / "mnt") not in Path("/proc/mounts").read_text()
    leftovers = [cmdline for cmdline in _command_lines() if str(work) in cmdline]
    assert leftovers == [], leftovers


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="it is stopped once its mount is up: needs /dev/fuse and fusermount3")
def test_a_pipeline_stopped_with_sigterm_stops_what_it_started(tmp_path: Path) -> None:
    """``kill PID`` (a service manager's stop) once the mount is up: the pipeline unwinds,
    and its mount, daemon and S3 server are gone when it exits."""
    work = tmp_path / "work"
    with subprocess.Popen([sys.executable, str(REPO / "examples" / "pipeline.py"), str(work)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pipeline:
        try:
            assert pipeline.stdout is not None
            for line in pipeline.stdout:  # progress, not a deadline: the line comes once it is up
                if "[pipeline] " in line and str(work / "mnt") in Path("/proc/mounts").read_text():
                    break
            else:
                pytest.fail("the pipeline ended before its mount was up")
            pipeline.terminate()
            assert pipeline.wait(timeout=120) == 128 + signal.SIGTERM
        finally:
            if pipeline.poll() is None:
                pipeline.kill()
    assert str(work / "mnt") not in Path("/proc/mounts").read_text()
    leftovers = [cmdline for cmdline in _command_lines() if str(work) in cmdline]
    assert leftovers == [], leftovers


def _command_lines() -> list[str]:
    return [command.replace(b"\0", b" ").decode(errors="replace") for _, _, command in processes()]
