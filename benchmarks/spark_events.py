"""Spark benchmark, scenario ``events`` (``python -m benchmarks spark --scenario events``):
JSON events read through the tierfs data source (``format`` ``json`` and ``lines``)
next to Spark's own readers of the same bytes in a local file, and next to Spark's
ceiling for a Python data source, with 1 and with 2 executor cores, in one run.

Set-up (untimed): ``--size-mib`` MiB (default 1024) of seeded JSON event lines, about
200 bytes each (``ts``, ``user``, ``kind``, ``n``, ``score``, ``ok``, ``msg``), written
to a local file ``events.json`` in the scratch directory and, by 1 MiB appends, to a
segment of a store whose tier-2 is the scratch directory's chunk store (local disk),
flushed; then a tierfs daemon on that store. Executors read the chunk files directly.

Each of ``--rounds`` rounds (default 2) opens a fresh ``local[1]`` and a fresh
``local[2]`` SparkSession (the order alternates between rounds; the driver binds to
127.0.0.1) and measures in each, every figure the second of two identical jobs (the
first runs while the JVM compiles and the Python workers start), alternating between
rounds which of a pair goes first:

- (j) ``spark.read.format("tierfs").option("format", "json").schema(EVENTS)``,
  ``--partition-mib`` partitions (default 16): an aggregate over every column;
- (J) ``spark.read.schema(EVENTS).json("events.json")``, the same aggregate (what a
  user compares with); its totals must equal (j)'s;
- (m) ``ArrowMemorySource`` (``benchmarks/spark_ceiling.py``) with (j)'s schema and
  partition count: the same number of rows, one Arrow batch yielded again and again
  from memory (no I/O, no parsing): what a Python data source can hand to the JVM;
- (l), (T), (n): the same three for ``format("lines")`` / ``spark.read.text`` /
  ``ArrowMemorySource``, each with ``spark.read.text``'s one column ``value string``:
  ``count(*)`` and ``sum(length(value))``, which must be equal;
- (p) ``format("lines")`` with its default schema ``path string, offset long, value
  string``: what the same job costs when every row also carries its segment's name
  and offset to the JVM.

Throughput is the events file's size over the job's wall time. Each ratio is the median
over the rounds of the ratio within one session. Targets (issue 19):
(j)/(J) and (l)/(T) >= 1.0 (never below 0.7), with 1 and with 2 cores; (x, local[2]) /
(x, local[1]) >= 1.6 for (j) and (l). On a machine that cannot show a target, the
ceilings measured beside it ((m), (n), and how the local-file readers scale) say why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import sys
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

from benchmarks.common import Check, MiB, Throughput, format_checks, print_sections

SEGMENT = "bench/events"
EVENTS = "ts timestamp, user string, kind string, n long, score double, ok boolean, msg string"
JSON_AGGREGATE = ["count(*)", "sum(n)", "round(sum(score), 3)", "count(user)", "count(kind)",
                  "count(ts)", "sum(cast(ok as int))", "sum(length(msg))"]
LINES_AGGREGATE = ["count(*)", "sum(length(value))"]
SAMPLE_BYTES = 4 * MiB  # one Arrow batch of the memory ceiling: one read piece of events
KINDS = ("view", "click", "buy", "scroll", "share")
DAEMON_TIMEOUT_S = 60.0
CASES = ("j", "J", "m", "l", "p", "T", "n")
LABELS = {"j": "tierfs json", "J": "spark.read.json", "m": "memory, json rows",
          "l": "tierfs lines", "p": "tierfs lines+path", "T": "spark.read.text",
          "n": "memory, lines rows"}
MASTERS = ("local[1]", "local[2]")


@dataclasses.dataclass(frozen=True)
class SessionRound:
    master: str
    figures: dict[str, Throughput]  # case letter -> figure


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    events: int
    partitions: int
    rounds: list[list[SessionRound]]

    def median(self, case: str, master: str) -> float:
        return statistics.median(s.figures[case].mb_per_s for r in self.rounds for s in r if s.master == master)

    def ratio(self, case: str, other: str, master: str) -> float:
        """Median over the rounds of ``case`` / ``other`` in the ``master`` session."""
        return statistics.median(s.figures[case].mb_per_s / s.figures[other].mb_per_s
                                 for r in self.rounds for s in r if s.master == master)

    def scaling(self, case: str) -> float:
        """Median over the rounds of ``case`` with local[2] / with local[1]."""
        return statistics.median(
            next(s for s in r if s.master == "local[2]").figures[case].mb_per_s
            / next(s for s in r if s.master == "local[1]").figures[case].mb_per_s for r in self.rounds)


def make_events(size: int, seed: int = 19) -> tuple[bytes, int]:
    """Seeded JSON event lines, about ``size`` bytes in all (whole lines)."""
    rng = random.Random(seed)
    lines, total, count = [], 0, 0
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    while total < size:
        line = json.dumps({
            "ts": f"2026-01-{1 + count % 28:02d}T{count % 24:02d}:{count % 60:02d}:{(count * 7) % 60:02d}Z",
            "user": f"u{rng.randrange(100000)}", "kind": KINDS[rng.randrange(len(KINDS))],
            "n": rng.randrange(-(10**6), 10**6), "score": round(rng.random() * 1000, 6),
            "ok": rng.random() < 0.5, "msg": " ".join(rng.choices(words, k=rng.randrange(4, 16))),
        }, separators=(",", ":")).encode() + b"\n"
        lines.append(line)
        total += len(line)
        count += 1
    return b"".join(lines), count


def new_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from tierfs.spark.loopback import bind_to_loopback_unless_configured

    bind_to_loopback_unless_configured()
    session = (SparkSession.builder.master(master).appName("tierfs-bench")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def _second_of_two(frame: Any, aggregate: list[str]) -> tuple[float, tuple[Any, ...]]:
    frame.selectExpr(*aggregate).collect()
    started = perf_counter()
    totals = tuple(frame.selectExpr(*aggregate).collect()[0])
    return perf_counter() - started, totals


def _session_round(master: str, index: int, directory: Path, size: int, events: int,
                   partition_bytes: int, log: TextIO) -> tuple[SessionRound, int]:
    from benchmarks.spark_ceiling import ArrowMemorySource
    from tierfs.spark import register

    spark = new_session(master)
    try:
        register(spark)
        spark.dataSource.register(ArrowMemorySource)
        data_dir, file = str(directory / "data"), str(directory / "events.json")

        def tierfs(form: str, schema: str) -> Any:
            return (spark.read.format("tierfs").option("format", form).option("data_dir", data_dir)
                    .option("partition_bytes", str(partition_bytes)).schema(schema).load(f"tierfs://{SEGMENT}"))

        json_frame = tierfs("json", f"path string, offset long, {EVENTS}")
        lines_frame = tierfs("lines", "value string")
        partitions = json_frame.rdd.getNumPartitions()

        def memory(form: str, schema: str) -> Any:
            return (spark.read.format("tierfs-bench-arrow-memory").option("sample", str(directory / "sample.json"))
                    .option("format", form).option("rows", str(events)).option("partitions", str(partitions))
                    .schema(schema).load())

        frames = {"j": (json_frame, JSON_AGGREGATE), "J": (spark.read.schema(EVENTS).json(file), JSON_AGGREGATE),
                  "m": (memory("json", f"path string, offset long, {EVENTS}"), ["count(*)"]),
                  "l": (lines_frame, LINES_AGGREGATE), "T": (spark.read.text(file), LINES_AGGREGATE),
                  "p": (tierfs("lines", "path string, offset long, value string"), LINES_AGGREGATE),
                  "n": (memory("lines", "value string"), ["count(*)"])}
        order = list(CASES) if index % 2 == 0 else ["J", "j", "m", "T", "p", "l", "n"]
        seconds: dict[str, float] = {}
        totals: dict[str, tuple[Any, ...]] = {}
        for case in order:
            seconds[case], totals[case] = _second_of_two(*frames[case])
            print(f"round {index + 1} {master}: {LABELS[case]} {size / seconds[case] / 1e6:.1f} MB/s",
                  file=log, flush=True)
        if totals["j"] != totals["J"] or totals["l"] != totals["T"] or totals["p"] != totals["T"] \
                or totals["l"][0] != events:
            raise RuntimeError(f"the readers disagree: {totals}")
        if totals["m"][0] != events or totals["n"][0] != events:
            raise RuntimeError(f"the memory sources gave {totals['m']} and {totals['n']} rows, not {events}")
        figures = {case: Throughput.of(f"{LABELS[case]}, {master}", size, seconds[case]) for case in CASES}
        return SessionRound(master, figures), partitions
    finally:
        spark.stop()


def measure(directory: Path, size: int, rounds: int, partition_bytes: int, log: TextIO) -> Results:
    import trio

    from tierfs import StoreConfig
    from tierfs.testing.harness import start_daemon

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    payload, events = make_events(size)
    (directory / "events.json").write_bytes(payload)
    cut = payload.rfind(b"\n", 0, SAMPLE_BYTES) + 1
    (directory / "sample.json").write_bytes(payload[: cut or len(payload)])
    print(f"{len(payload) / MiB:.0f} MiB of events ({events} lines); writing the segment ...", file=log, flush=True)
    data_dir = directory / "data"
    trio.run(write_segment, StoreConfig(data_dir=data_dir), payload)
    del payload
    daemon = start_daemon(data_dir, drop_tierfs_env=True, log_path=directory / "daemon.log",
                          verbose=False, timeout_s=DAEMON_TIMEOUT_S)
    try:
        measured, partitions = [], 0
        for index in range(rounds):
            masters = MASTERS if index % 2 == 0 else MASTERS[::-1]
            sessions = []
            for master in masters:
                session, partitions = _session_round(master, index, directory, size, events,
                                                     partition_bytes, log)
                sessions.append(session)
            measured.append(sessions)
    finally:
        daemon.stop(timeout_s=DAEMON_TIMEOUT_S)
    return Results(size, events, partitions, measured)


async def write_segment(config: Any, payload: bytes) -> None:
    """The segment by 1 MiB appends, flushed to tier-2 (every byte in chunk files)."""
    from tierfs import open_store

    async with open_store(config) as store:
        await store.create(SEGMENT, make_parents=True)
        view = memoryview(payload)
        for offset in range(0, len(payload), MiB):
            await store.append(SEGMENT, view[offset : offset + MiB])
        await store.flush()


def checks(results: Results) -> list[Check]:
    """The targets, each the median over the rounds of a ratio within one session (or,
    for scaling, within one round): figures measured seconds apart share the
    machine's load."""
    found = []
    for master in MASTERS:
        for ours, theirs in (("j", "J"), ("l", "T")):
            ratio = results.ratio(ours, theirs, master)
            found.append(Check(f"({ours})/({theirs}) {master}", ratio, 1.0, True, "x"))
            found.append(Check(f"({ours})/({theirs}) {master}, floor", ratio, 0.7, True, "x"))
    for case in ("j", "l"):
        found.append(Check(f"({case}) local[2]/local[1]", results.scaling(case), 1.6, True, "x"))
    return found


def bounds(results: Results) -> list[str]:
    """The ceilings beside the targets: what the machine gives the other readers."""
    lines = [f"({case}) {LABELS[case]:<20} local[2]/local[1] {results.scaling(case):6.3f} x"
             for case in ("J", "T", "m", "n")]
    for master in MASTERS:
        for ours, memory in (("j", "m"), ("l", "n"), ("J", "m"), ("T", "n")):
            lines.append(f"({ours})/({memory}) {master}: {results.ratio(ours, memory, master):6.3f} x"
                         " the Python data source ceiling")
        lines.append(f"(p)/(T) {master}: {results.ratio('p', 'T', master):6.3f} x with path and offset columns")
    return lines


def print_report(machine: dict[str, Any], results: Results, found: list[Check], out: TextIO) -> None:
    header = [f"spark events benchmark: {results.size_bytes / MiB:.0f} MiB of JSON events ({results.events} "
              f"lines), tier-2 on local disk, {results.partitions} tierfs partitions", f"machine: {machine}"]
    rows = [f"{'round':<6} {'master':<9} " + " ".join(f"{'(' + c + ')':>7}" for c in CASES) + "   MB/s"]
    medians = [f"{'median':<6} {master:<9} " + " ".join(f"{results.median(c, master):7.1f}" for c in CASES)
               for master in MASTERS]
    for index, sessions in enumerate(results.rounds, start=1):
        for session in sessions:
            rows.append(f"{index:<6} {session.master:<9} "
                        + " ".join(f"{session.figures[c].mb_per_s:7.1f}" for c in CASES))
    legend = [f"({c}) {LABELS[c]}" for c in CASES]
    print_sections([header, rows + medians, legend, format_checks(found, 30), bounds(results)], out)


def report_json(machine: dict[str, Any], results: Results, found: list[Check]) -> dict[str, Any]:
    from benchmarks.common import checks_json

    return {"machine": machine, "results": dataclasses.asdict(results), "checks": checks_json(found),
            "bounds": bounds(results)}
