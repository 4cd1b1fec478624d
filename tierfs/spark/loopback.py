"""Local Spark that works on any fresh machine, unless the user configured otherwise.

- A machine whose own hostname does not resolve (containers, minimal images): Spark's
  JVM looks its host name up at start-up, before any session option is read, and fails
  with ``JAVA_GATEWAY_EXITED`` (``UnknownHostException``) unless ``SPARK_LOCAL_IP`` says
  where to bind (``bind_to_loopback_unless_configured``).
- Executors start Python workers with ``PYSPARK_PYTHON`` (default: the ``python3`` on
  their PATH), which may not have tierfs: the ``tierfs`` data source then fails on the
  executors with ``ModuleNotFoundError``. ``use_this_python_unless_configured`` points
  them at the interpreter running the driver, the one that has tierfs.

Invariant: these only fill in what the user left unset (``SPARK_LOCAL_IP``,
``SPARK_LOCAL_HOSTNAME``, ``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON``; a session's
``spark.pyspark.python`` still wins over the variable), so a configured cluster is never
overridden; they must run before the first SparkSession of the process.
"""

from __future__ import annotations

import os
import sys

LOOPBACK = "127.0.0.1"


def bind_to_loopback_unless_configured() -> None:
    if "SPARK_LOCAL_IP" not in os.environ and "SPARK_LOCAL_HOSTNAME" not in os.environ:
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK


def use_this_python_unless_configured() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_spark_defaults() -> None:
    """Both of the above: call once before building a local SparkSession."""
    bind_to_loopback_unless_configured()
    use_this_python_unless_configured()
