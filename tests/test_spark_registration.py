"""Zero-config Spark: once tierfs is pip-installed, ``format("tierfs")`` works in a new
SparkSession without ``register(spark)`` for batch reads, streaming reads, writes and
streaming writes (PySpark >= 4.0 registers the ``DefaultSource`` of the installed
package ``pyspark_tierfs`` by itself). That it also holds in ``./dev.sh``'s editable
venv, where dev.sh adds a ``pyspark_tierfs`` module PySpark can list, every other Spark
test shows: the suite's session (``conftest.spark``) never registers the format."""

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

    data_dir, checkpoint, top = sys.argv[1], sys.argv[2], sys.argv[3]
    bind_to_loopback_unless_configured()
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    read = spark.read.format("tierfs").option("format", "lines").option("data_dir", data_dir)
    rows = read.load(f"tierfs://{top}/log").collect()
    print("lines:", sorted(row["value"] for row in rows))
    spark.createDataFrame([("three",)], "value string").write.format("tierfs").mode("append") \\
        .option("format", "lines").option("data_dir", data_dir).save(f"tierfs://{top}/written")
    print("written:", [row["value"] for row in read.load(f"tierfs://{top}/written").collect()])
    stream = spark.readStream.format("tierfs").option("format", "lines").option("data_dir", data_dir) \\
        .schema("value string").load(f"tierfs://{top}/log")
    query = stream.writeStream.format("tierfs").option("format", "lines").option("data_dir", data_dir) \\
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(f"tierfs://{top}/copy")
    query.awaitTermination(240)
    print("streamed:", sorted(row["value"] for row in read.load(f"tierfs://{top}/copy").collect()))
    spark.stop()
""")
EXPECTED = ["lines: ['one', 'two']", "written: ['three']", "streamed: ['one', 'two']"]

needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="Spark needs a Java runtime (./dev.sh test installs one)")


def run_job_without_register(daemon: Daemon, tmp_path: Path, env: dict[str, str]) -> None:
    top = tmp_path.name  # the daemon is shared by the module's tests
    client = daemon.client()
    client.create(f"{top}/log", parents=True)
    client.append(f"{top}/log", b"one\ntwo\n")
    client.close()
    done = subprocess.run([sys.executable, "-c", JOB, str(daemon.data_dir), str(tmp_path / "checkpoint"), top],
                          capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in EXPECTED:
        assert line in done.stdout, done.stdout


@needs_java
def test_format_tierfs_works_without_register_once_installed(daemon: Daemon, tmp_path: Path) -> None:
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(installed), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    assert (installed / "pyspark_tierfs" / "__init__.py").exists()
    run_job_without_register(daemon, tmp_path, dict(os.environ, PYTHONPATH=str(installed),
                                                    PYSPARK_PYTHON=sys.executable))

