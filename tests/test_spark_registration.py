"""Zero-config Spark: once tierfs is pip-installed, ``format("tierfs")`` works in a new
SparkSession without ``register(spark)`` (PySpark >= 4.0 registers the ``DefaultSource``
of the installed package ``pyspark_tierfs`` by itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tierfs.testing.harness import Daemon

REPO = Path(__file__).resolve().parent.parent

JOB = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from tierfs.spark.loopback import bind_to_loopback_unless_configured

    bind_to_loopback_unless_configured()
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    rows = spark.read.format("tierfs").option("format", "lines").option("data_dir", sys.argv[1]) \\
        .load("tierfs://zero-config/log").collect()
    print("lines:", sorted(row["value"] for row in rows))
    spark.stop()
""")


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
def test_format_tierfs_works_without_register_once_installed(daemon: Daemon, tmp_path: Path) -> None:
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(installed), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    assert (installed / "pyspark_tierfs" / "__init__.py").exists()
    client = daemon.client()
    client.create("zero-config/log", parents=True)
    client.append("zero-config/log", b"one\ntwo\n")
    client.close()
    env = dict(os.environ, PYTHONPATH=str(installed), PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-c", JOB, str(daemon.data_dir)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lines: ['one', 'two']" in done.stdout, done.stdout
