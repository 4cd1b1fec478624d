"""Local Spark sessions of the examples start on a host whose own name does not resolve
(a fresh UTS namespace with an unresolvable hostname, as in many containers), and their
workers run a Python that has tierfs even where the ``python3`` on PATH has not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNRESOLVABLE = "tierfs-unresolvable-host"
# the session the example jobs build (examples/events/event_counts.py, history.py); its
# task imports tierfs on a worker
SESSION_SCRIPT = """
import sys
from pyspark.sql import SparkSession
from tierfs.spark.loopback import local_spark_defaults
if sys.argv[1] == "defaults":
    local_spark_defaults()
else:
    from tierfs.spark.loopback import bind_to_loopback_unless_configured
    bind_to_loopback_unless_configured()
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("workers import tierfs:", spark.sparkContext.parallelize([0], 1).map(
    lambda _: __import__("tierfs").__name__).collect())
spark.stop()
"""
needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="Spark needs a Java runtime (./dev.sh test installs one)")


def _unbound_env() -> dict[str, str]:
    """This environment without the address Spark binds to (the suite's own session may
    have set it): each session here finds its own."""
    return {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")}


def _without_tierfs_on_path(tmp_path: Path) -> dict[str, str]:
    """With nothing configured, workers run the ``python3`` on PATH; here that is an
    interpreter without tierfs (a fresh venv), as on a machine where tierfs lives in .venv."""
    bare_venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare_venv)], check=True)
    env = {k: v for k, v in _unbound_env().items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{bare_venv / 'bin'}{os.pathsep}{env['PATH']}"
    return env


def _session(script: str, mode: str, env: dict[str, str], cwd: Path,
             unresolvable: bool) -> subprocess.CompletedProcess[str]:
    """``script`` in a new Python; ``unresolvable``: in a fresh UTS namespace whose host
    name does not resolve. Run outside the checkout: its tierfs/ would be found."""
    if not unresolvable:
        return subprocess.run([sys.executable, "-c", script, mode], env=env, capture_output=True, text=True,
                              timeout=240, cwd=cwd)
    command = f"hostname {UNRESOLVABLE} && exec {sys.executable} -c \"$0\" \"$1\""
    return subprocess.run(["unshare", "--uts", "sh", "-c", command, script, mode], env=env,
                          capture_output=True, text=True, timeout=240, cwd=cwd)


def _can_unshare() -> bool:
    return os.getuid() == 0  # a host name of its own (unshare --uts) takes root


@needs_java
def test_the_examples_session_starts_where_the_hostname_does_not_resolve_and_its_workers_import_tierfs(
        tmp_path: Path) -> None:
    """One session shows both (as root; elsewhere only the second: the host name's part
    is skipped)."""
    env = _without_tierfs_on_path(tmp_path)
    unresolvable = _can_unshare()
    if unresolvable:
        probe = subprocess.run(["unshare", "--uts", "sh", "-c",
                                f"hostname {UNRESOLVABLE} && getent hosts {UNRESOLVABLE}"],
                               capture_output=True, text=True)
        assert probe.returncode == 2, "the test host must not resolve (getent found it, or unshare failed)"
    result = _session(SESSION_SCRIPT, "defaults", env, tmp_path, unresolvable)
    assert "workers import tierfs: ['tierfs']" in result.stdout, result.stderr[-3000:]


@needs_java
@pytest.mark.skipif(not _can_unshare(), reason="a host name of its own (unshare --uts) takes root")
def test_without_the_defaults_a_session_fails_where_the_hostname_does_not_resolve(tmp_path: Path) -> None:
    """The check above can fail: the JVM gives up before a session exists."""
    bare = _session("from pyspark.sql import SparkSession\n"
                    "SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n",
                    "bare", _unbound_env(), tmp_path, unresolvable=True)
    assert bare.returncode != 0 and "JAVA_GATEWAY_EXITED" in bare.stderr


@needs_java
def test_without_the_defaults_workers_run_a_python_without_tierfs(tmp_path: Path) -> None:
    """The check above can fail: the same session, without ``local_spark_defaults``."""
    without = _session(SESSION_SCRIPT, "bare", _without_tierfs_on_path(tmp_path), tmp_path, unresolvable=False)
    assert without.returncode != 0 and "No module named" in without.stderr, without.stderr[-2000:]
