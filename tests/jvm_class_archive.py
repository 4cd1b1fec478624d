"""A class-data-sharing archive of Spark's classes for the suite's JVMs.

A Spark session's JVM spends a third of its start-up CPU loading and verifying the
same few thousand classes from Spark's jars (measured on the 2-core machine: a local
session and two small jobs take 10-11 CPU-s, 6.4-7.4 with the archive). The suite
starts dozens of them, so the run makes the archive once, in the background at its
start (``start``: one Spark job run with ``-XX:ArchiveClassesAtExit``, written under a
temporary name and renamed when whole), and every test that begins after it exists
hands it to the JVMs it starts (``use_if_ready``, through ``JDK_JAVA_OPTIONS``).

Safe by construction: a JVM whose class path differs from the archive's (spark-submit's
launcher, a standalone master, worker or executor) or whose Java differs ignores the
archive; ``-Xlog:cds*=off`` keeps that silent, so no test's output changes. The file is
keyed by the Java and PySpark versions and the JVM options, and kept in the venv, so a
second run on the same machine reuses it. A ``JDK_JAVA_OPTIONS`` the caller set is
left alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ARCHIVE_ENV = "TIERFS_TEST_JVM_ARCHIVE"  # the controller's choice, inherited by xdist workers
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# The classes the suite's sessions load: SQL, JSON and text sources, a shuffle, a
# Python UDF, a Python data source (tierfs's format is one) and a streaming query.
JOB = """
import sys, tempfile
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.functions import udf

class Numbers(DataSource):
    @classmethod
    def name(cls):
        return "numbers"
    def schema(self):
        return "value long"
    def reader(self, schema):
        return NumbersReader()

class NumbersReader(DataSourceReader):
    def read(self, partition):
        yield from ((i,) for i in range(10))

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.dataSource.register(Numbers)
with tempfile.TemporaryDirectory() as scratch:
    spark.read.format("numbers").load().groupBy().sum().collect()
    spark.range(100).selectExpr("id % 7 AS k").groupBy("k").count().write.json(f"{scratch}/out")
    spark.read.json(f"{scratch}/out").select(udf(lambda k: k * 2, "long")("k")).collect()
    spark.read.text(f"{scratch}/out").toPandas()
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.format("memory").queryName("rates").trigger(availableNow=True).start())
    query.awaitTermination(120)
jvm = spark.sparkContext._gateway.proc  # spark-submit, which execs the JVM
spark.stop()
jvm.stdin.close()  # the gateway's signal to exit; the archive is written as it does
jvm.wait(120)
"""


def archive_path() -> Path | None:
    """Where the archive for this Java, PySpark and option set lives (None: no Java)."""
    java = shutil.which("java")
    if java is None:
        return None
    try:
        from importlib.metadata import version

        pyspark = version("pyspark")
        described = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                                   env={k: v for k, v in os.environ.items() if k != "JDK_JAVA_OPTIONS"})
    except (OSError, subprocess.SubprocessError, ImportError):
        return None
    key = hashlib.sha256(f"{described.stderr}|{pyspark}|{BASE_OPTIONS}".encode()).hexdigest()[:16]
    return Path(sys.prefix) / "share" / "tierfs-tests" / f"spark-classes-{key}.jsa"


def start(*, make: bool) -> subprocess.Popen[bytes] | None:
    """In the run's first process: choose the archive and, if it is not there and
    ``make`` (a run of many tests), begin making it (the caller waits for the returned
    process at the run's end)."""
    if ARCHIVE_ENV in os.environ or os.environ.get("JDK_JAVA_OPTIONS", BASE_OPTIONS) != BASE_OPTIONS:
        return None
    path = archive_path()
    if path is None:
        return None
    if not path.exists() and not make:
        return None
    os.environ[ARCHIVE_ENV] = str(path)
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    # the rename is the last step: a JVM never sees half an archive
    script = f"{JOB}\nimport os\nos.replace({str(partial)!r}, {str(path)!r})\n"
    env = dict(os.environ, JDK_JAVA_OPTIONS=f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off",
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def use_if_ready() -> None:
    """Before a test: JVMs it starts use the archive once it exists."""
    path = os.environ.get(ARCHIVE_ENV)
    options = os.environ.get("JDK_JAVA_OPTIONS")
    if path and options == BASE_OPTIONS and os.path.exists(path):
        os.environ["JDK_JAVA_OPTIONS"] = f"{BASE_OPTIONS} -XX:SharedArchiveFile={path} -Xlog:cds*=off"
