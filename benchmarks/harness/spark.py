"""Spark sessions of the benchmarks and the timing of one Spark job.

Invariants: a session is ``local[N]`` with its driver on 127.0.0.1 (no host name looked
up) and no UI; a timed job is the second of two identical ones in its session (the first
runs at a fraction of the speed while the JVM compiles and the Python workers start),
and its CPU is that of every process of the tree, by kind (``procfs.cpu_by_kind``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from benchmarks.harness import procfs


def new_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from tierfs.spark.loopback import local_spark_defaults

    local_spark_defaults()
    session = (SparkSession.builder.master(master).appName("tierfs-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def second_of_two(frame: Any, aggregate: list[str]) -> tuple[float, tuple[Any, ...], dict[str, float]]:
    """The second job's seconds, its totals, and the CPU it cost each kind of process."""
    frame.selectExpr(*aggregate).collect()
    before, started = procfs.cpu_by_kind(), perf_counter()
    totals = tuple(frame.selectExpr(*aggregate).collect()[0])
    seconds = perf_counter() - started
    return seconds, totals, procfs.spent(before, procfs.cpu_by_kind())
