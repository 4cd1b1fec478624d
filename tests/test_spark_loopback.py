"""Local Spark sessions of the examples start on a host whose own name does not resolve
(a fresh UTS namespace with an unresolvable hostname, as in many containers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNRESOLVABLE = "tierfs-unresolvable-host"
# the session the example jobs build (examples/events/event_counts.py, history.py)
SESSION_SCRIPT = """
from pyspark.sql import SparkSession
from tierfs.spark.loopback import local_spark_defaults
local_spark_defaults()
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
print("rows", spark.range(7).count())
spark.stop()
"""


def _in_unresolvable_host(script: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")}
    command = f"hostname {UNRESOLVABLE} && exec {sys.executable} -c \"$0\""
    return subprocess.run(["unshare", "--uts", "sh", "-c", command, script], env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
@pytest.mark.skipif(os.getuid() != 0, reason="a host name of its own (unshare --uts) takes root")
def test_the_examples_spark_session_starts_where_the_hostname_does_not_resolve() -> None:
    probe = subprocess.run(["unshare", "--uts", "sh", "-c", f"hostname {UNRESOLVABLE} && getent hosts {UNRESOLVABLE}"],
                           capture_output=True, text=True)
    assert probe.returncode == 2, "the test host must not resolve (getent found it, or unshare failed: run as root)"
    result = _in_unresolvable_host(SESSION_SCRIPT)
    assert "rows 7" in result.stdout, result.stderr[-3000:]
    # and the same session without the default fails there: the test can fail
    bare = _in_unresolvable_host(
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
    )
    assert bare.returncode != 0 and "JAVA_GATEWAY_EXITED" in bare.stderr


WORKERS_SCRIPT = """
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


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
def test_local_spark_workers_use_the_python_that_has_tierfs(tmp_path: Path) -> None:
    """With nothing configured, workers run the ``python3`` on PATH; here that is an
    interpreter without tierfs (a fresh venv), as on a machine where tierfs lives in .venv."""
    bare_venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare_venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{bare_venv / 'bin'}{os.pathsep}{env['PATH']}"
    run = [sys.executable, "-c", WORKERS_SCRIPT]
    with_defaults = subprocess.run([*run, "defaults"], env=env, capture_output=True, text=True, timeout=240,
                                   cwd=tmp_path)  # not the checkout: its tierfs/ would be found
    assert "workers import tierfs: ['tierfs']" in with_defaults.stdout, with_defaults.stderr[-3000:]
    without = subprocess.run([*run, "bare"], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert without.returncode != 0 and "No module named" in without.stderr, without.stderr[-2000:]
