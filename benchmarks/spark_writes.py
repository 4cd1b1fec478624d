"""Spark benchmark, scenario ``events``, the write rows: the same rows written through
``df.write.format("tierfs").mode("append")`` and by ``df.write.json`` to a local
directory, in the same session, next to Spark's ``noop`` sink (what producing the rows
costs with no writer at all).

The rows have the events' schema (``spark_events.EVENTS``) and as many rows as the
events file, made by Spark expressions from ``spark.range`` in the read's partition
count (``events_frame``): neither writer's time includes reading or parsing input, so
the ratio is the writers' alone. Each figure is the second of two jobs: a first one
with a sixteenth of the rows starts the session's writer code (JIT, Python workers).

- (w) tierfs: into a new segment of the benchmark's daemon (tier-2 on local disk),
  JSON lines; checked: the segment holds exactly the bytes the tasks reported, and
  its first line is an event; deleted afterwards.
- (W) ``df.write.mode("overwrite").json(<scratch>/written-json)``; its part files'
  bytes are counted.
- (o) ``df.write.format("noop").mode("overwrite").save()``.
- (x) ``ArrowDiscardSink`` (``benchmarks/spark_write_ceiling.py``): a Python data
  source whose tasks take the Arrow batches, as tierfs's writer does, and discard
  them: the ceiling of any Python writer here (the rows handed to Python).
- (e) the same sink encoding each batch as tierfs does (``BatchEncoder``), then
  discarding it: (w) without the appends to the daemon.

The ratio (w)/(W) compares rows per second (the same rows; the two write timestamps
differently: Spark as ``2026-01-01T00:00:00.000Z``, tierfs as Python's isoformat).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks.common import Throughput

WRITE_CASES = ("w", "W", "o", "x", "e")
WRITE_LABELS = {"w": "tierfs write (json)", "W": "df.write.json, local dir", "o": "noop sink (rows only)",
                "x": "Python sink, discard", "e": "Python sink, encode"}
WARM_UP_FRACTION = 16  # the first job of each case writes 1/16 of the rows
WORDS = "array('alpha','beta','gamma','delta','epsilon','zeta','eta','theta'," \
        "'alpha','beta','gamma','delta','epsilon','zeta','eta','theta')"
EVENT_COLUMNS = [
    "timestamp_seconds(1767225600 + id) as ts",
    "concat('u', cast((id * 7919) % 100000 as string)) as user",
    "element_at(array('view','click','buy','scroll','share'), cast(id % 5 as int) + 1) as kind",
    "(id * 104729) % 2000000 - 1000000 as n",
    "cast((id * 2654435761) % 1000000007 as double) / 1000 as score",
    "id % 3 = 0 as ok",
    f"concat_ws(' ', slice({WORDS}, cast(id % 8 as int) + 1, cast(4 + id % 12 as int))) as msg",
]


def events_frame(spark: Any, rows: int, partitions: int) -> Any:
    """``rows`` rows of the events' schema, generated in ``partitions`` partitions."""
    return spark.range(0, rows, 1, partitions).selectExpr(*EVENT_COLUMNS)


def _tierfs_write(frame: Any, data_dir: str, segment: str) -> None:
    (frame.write.format("tierfs").mode("append").option("data_dir", data_dir)
     .save(f"tierfs://{segment}"))


def _checked_segment_bytes(client: Any, segment: str) -> int:
    """The written segment's length, after checking its first line is an event; then
    the segment is deleted."""
    info = client.stat(segment)
    first = client.read(segment, 0, min(info.length, 4096)).split(b"\n", 1)[0]
    if set(json.loads(first)) != {"ts", "user", "kind", "n", "score", "ok", "msg"}:
        raise RuntimeError(f"{segment} does not start with an event: {first[:200]!r}")
    client.delete(segment)
    return int(info.length)


def _directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.glob("part-*"))


def write_round(spark: Any, client: Any, directory: Path, data_dir: str, rows: int, partitions: int,
                tag: str, order: tuple[str, ...]) -> tuple[dict[str, Throughput], dict[str, dict[str, float]]]:
    """The write cases in ``order``, each the second of two jobs; MB/s of the bytes
    each wrote (for (o), (x), (e): of what tierfs wrote, as a rate of rows), and the CPU
    each timed job cost every process, by kind (``process_cpu``: the JVM, its Python
    workers, the tierfs daemon)."""
    from benchmarks import process_cpu
    from benchmarks.spark_write_ceiling import ArrowDiscardSink

    spark.dataSource.register(ArrowDiscardSink)
    frame = events_frame(spark, rows, partitions)
    warm_up = events_frame(spark, max(1, rows // WARM_UP_FRACTION), partitions)
    local = directory / "written-json"
    seconds: dict[str, float] = {}
    written: dict[str, int] = {}
    cpu: dict[str, dict[str, float]] = {}

    def timed(case: str, job: Any) -> None:
        before = process_cpu.snapshot()
        started = perf_counter()
        job()
        seconds[case] = perf_counter() - started
        cpu[case] = process_cpu.spent(before, process_cpu.snapshot())

    for case in order:
        if case == "w":
            _tierfs_write(warm_up, data_dir, f"bench/warm-{tag}")
            _checked_segment_bytes(client, f"bench/warm-{tag}")
            timed(case, functools.partial(_tierfs_write, frame, data_dir, f"bench/written-{tag}"))
            written[case] = _checked_segment_bytes(client, f"bench/written-{tag}")
        elif case == "W":
            warm_up.write.mode("overwrite").json(str(local))
            timed(case, functools.partial(frame.write.mode("overwrite").json, str(local)))
            written[case] = _directory_bytes(local)
        elif case in ("x", "e"):
            encode = "1" if case == "e" else "0"
            warm_up.write.format(ArrowDiscardSink.name()).option("encode", encode).mode("append").save()
            timed(case, frame.write.format(ArrowDiscardSink.name()).option("encode", encode).mode("append").save)
        else:
            warm_up.write.format("noop").mode("overwrite").save()
            timed(case, frame.write.format("noop").mode("overwrite").save)
    for case in ("o", "x", "e"):
        written[case] = written.get("w", 0)
    figures = {case: Throughput.of(f"{WRITE_LABELS[case]}, {tag}", written[case], seconds[case]) for case in order}
    return figures, cpu


def rows_ratio(ours: Throughput, theirs: Throughput) -> float:
    """Rows per second of ``ours`` over ``theirs`` (the same rows): their time / ours."""
    return theirs.seconds / ours.seconds
