"""A class-data-sharing archive of Spark's classes for the suite's JVMs.

A Spark session's JVM spends a third of its start-up CPU loading and verifying the
same few thousand classes from Spark's jars (measured on the 2-core machine: a local
session and two small jobs take 10-11 CPU-s, 6.4-7.4 with the archive), and the suite
starts a few dozen of them. ``./dev.sh test`` makes the archive once per machine, as
it sets up the venv (``python tests/jvm_class_archive.py``: one Spark job run with
``-XX:ArchiveClassesAtExit``, about 30 s, written under a temporary name and renamed
when whole, replacing the archive of an earlier Java or PySpark; a failure to make it
is reported and the tests run without it); the suite hands it to every JVM it starts
through ``JDK_JAVA_OPTIONS`` (``java_options``) when it is there, and runs as before
when it is not.

Safe by construction: a JVM whose class path differs from the archive's (spark-submit's
launcher, a standalone master, worker or executor) or whose Java differs ignores the
archive; ``-Xlog:cds*=off`` keeps that silent, so no test's output changes. The file is
keyed by the Java and PySpark versions and the JVM options and kept in the venv.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def java_options() -> str:
    """The suite's ``JDK_JAVA_OPTIONS``: ``BASE_OPTIONS``, and the archive once made."""
    path = archive_path()
    if path is None or not path.exists():
        return BASE_OPTIONS
    return f"{BASE_OPTIONS} -XX:SharedArchiveFile={path} -Xlog:cds*=off"


def make() -> Path | None:
    """Make the archive unless it exists (or there is no Java); its path."""
    path = archive_path()
    if path is None or path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("spark-classes-*.jsa*"):  # another Java's or PySpark's: ~170 MB each
        old.unlink(missing_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    script = f"{JOB}\nimport os\nos.replace({str(partial)!r}, {str(path)!r})\n"  # whole, or not there
    env = dict(os.environ, JDK_JAVA_OPTIONS=f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off",
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    try:
        subprocess.run([sys.executable, "-c", script], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       check=True, timeout=600)
    finally:
        partial.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    target = archive_path()
    if target is not None and not target.exists():
        print("dev.sh: archiving Spark's classes for the suite's JVMs (once per machine, about 30 s)",
              file=sys.stderr, flush=True)
        try:
            make()
        except subprocess.CalledProcessError as e:  # only slower without it: the tests still run
            print(f"dev.sh: the Spark job that archives its classes exited {e.returncode}; the suite's JVMs "
                  f"start without the archive:\n{e.stderr.decode(errors='replace')[-2000:]}", file=sys.stderr)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"dev.sh: no archive of Spark's classes ({e}); the suite's JVMs start without it", file=sys.stderr)
