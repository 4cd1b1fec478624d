"""Spark benchmark, scenario ``events``: JSON events read through the tierfs data source
next to Spark's own readers of the same bytes in a local file and Spark's ceiling for a
Python data source, and the same rows written, with 1 and 2 executor cores, in one run.

Set-up: ``--size-mib`` (1024) MiB of seeded JSON event lines (~200 bytes each) in a local
file and, by 1 MiB appends, in a segment on a local tier-2, flushed; a tierfs daemon
(executors read the chunk files directly). Each of ``--rounds`` (2) opens a fresh
``local[1]`` and ``local[2]`` session (the order alternating) and times in each, the
second of two identical jobs: (j) ``format("tierfs")`` json (``--partition-mib``
partitions, default the source's 64 MiB), an aggregate over every column; (k) the same
with ``parse_threads`` 2; (J) ``spark.read.json``, whose totals must equal (j)'s; (m) the
memory source (``ceiling.py``) with (j)'s schema, rows and aggregate; (l), (T), (n) the
same for ``format("lines")``, ``spark.read.text`` and the memory source; (p) ``lines``
with path and offset on every row; and the writes (``writes.py``).

Around every timed job the CPU of each process is read from ``/proc``; the report prints
it per MiB and the bound it sets on each target. Targets (issue 19), medians of the
ratios within one session: (j)/(J) and (l)/(T) >= 1.0 (never below 0.7) with 1 and 2
cores; local[2]/local[1] >= 1.6 for (j) and (l); (w)/(W) >= 0.5 in rows per second.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.figures import Check, MiB, Throughput
from benchmarks.harness.procfs import WORKERS, describe_per_mib
from benchmarks.harness.scenario import Report, table
from benchmarks.harness.spark import new_session, second_of_two
from benchmarks.spark.writes import WRITE_CASES, WRITE_LABELS, write_round

SEGMENT = "bench/events"
EVENTS = "ts timestamp, user string, kind string, n long, score double, ok boolean, msg string"
JSON_AGGREGATE = ["count(*)", "sum(n)", "round(sum(score), 3)", "count(user)", "count(kind)",
                  "count(ts)", "sum(cast(ok as int))", "sum(length(msg))"]
LINES_AGGREGATE = ["count(*)", "sum(length(value))"]
SAMPLE_BYTES = 4 * MiB  # one Arrow batch of the memory ceiling: one read piece of events
READ_CASES = ("j", "k", "J", "m", "l", "p", "T", "n")
CASES = READ_CASES + WRITE_CASES
LABELS = {"j": "tierfs json", "k": "tierfs json, 2 threads", "J": "spark.read.json", "m": "memory, json rows",
          "l": "tierfs lines", "p": "tierfs lines+path", "T": "spark.read.text", "n": "memory, lines rows",
          **WRITE_LABELS}
MASTERS = ("local[1]", "local[2]")
CORES = os.cpu_count() or 1  # the machine's: what the bounds let a job use at most
DAEMON_TIMEOUT_S = 60.0


def make_events(size: int, seed: int = 19) -> tuple[bytes, int]:
    """Seeded JSON event lines, about ``size`` bytes in all (whole lines)."""
    rng = random.Random(seed)
    lines, total, count = [], 0, 0
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    while total < size:
        line = json.dumps({
            "ts": f"2026-01-{1 + count % 28:02d}T{count % 24:02d}:{count % 60:02d}:{(count * 7) % 60:02d}Z",
            "user": f"u{rng.randrange(100000)}", "kind": ("view", "click", "buy", "scroll", "share")[rng.randrange(5)],
            "n": rng.randrange(-(10**6), 10**6), "score": round(rng.random() * 1000, 6),
            "ok": rng.random() < 0.5, "msg": " ".join(rng.choices(words, k=rng.randrange(4, 16))),
        }, separators=(",", ":")).encode() + b"\n"
        lines.append(line)
        total, count = total + len(line), count + 1
    return b"".join(lines), count


def session_round(master: str, index: int, directory: Path, size: int, events: int, partition_bytes: int | None,
                  client: Any) -> dict[str, Any]:
    """One session's read and write cases: {"figures": {case: Throughput}, "cpu": {case: by kind}}."""
    from benchmarks.spark.ceiling import ArrowMemorySource
    from tierfs.spark import register

    spark = new_session(master)
    try:
        register(spark)
        spark.dataSource.register(ArrowMemorySource)
        data_dir, file = str(directory / "data"), str(directory / "events.json")

        def tierfs(form: str, schema: str, parse_threads: int = 1) -> Any:
            reader = spark.read.format("tierfs").option("format", form).option("data_dir", data_dir)
            if partition_bytes is not None:
                reader = reader.option("partition_bytes", str(partition_bytes))
            return reader.option("parse_threads", str(parse_threads)).schema(schema).load(f"tierfs://{SEGMENT}")

        json_schema = f"path string, offset long, {EVENTS}"
        json_frame = tierfs("json", json_schema)
        partitions = json_frame.rdd.getNumPartitions()

        def memory(form: str, schema: str) -> Any:
            return (spark.read.format("tierfs-bench-arrow-memory").option("sample", str(directory / "sample.json"))
                    .option("format", form).option("rows", str(events)).option("partitions", str(partitions))
                    .schema(schema).load())

        frames = {"j": (json_frame, JSON_AGGREGATE), "k": (tierfs("json", json_schema, 2), JSON_AGGREGATE),
                  "J": (spark.read.schema(EVENTS).json(file), JSON_AGGREGATE),
                  "m": (memory("json", json_schema), JSON_AGGREGATE),
                  "l": (tierfs("lines", "value string"), LINES_AGGREGATE),
                  "T": (spark.read.text(file), LINES_AGGREGATE),
                  "p": (tierfs("lines", "path string, offset long, value string"), LINES_AGGREGATE),
                  "n": (memory("lines", "value string"), LINES_AGGREGATE)}
        seconds, totals, cpu = {}, {}, {}
        for case in READ_CASES if index % 2 == 0 else ("J", "k", "j", "m", "T", "p", "l", "n"):
            seconds[case], totals[case], cpu[case] = second_of_two(*frames[case])
            print(f"round {index + 1} {master}: {LABELS[case]} {size / seconds[case] / 1e6:.1f} MB/s", file=sys.stderr,
                  flush=True)
        if not (totals["j"] == totals["J"] == totals["k"] and totals["l"] == totals["T"] == totals["p"]
                and totals["l"][0] == events):
            raise RuntimeError(f"the readers disagree: {totals}")
        if totals["m"][0] != events or totals["n"][0] != events:
            raise RuntimeError(f"the memory sources gave {totals['m']} and {totals['n']} rows, not {events}")
        figures = {case: Throughput(f"{LABELS[case]}, {master}", size, seconds[case]) for case in READ_CASES}
        writes, write_cpu = write_round(spark, client, directory, data_dir, events, partitions, f"{index}-{master[6]}",
                                        WRITE_CASES if index % 2 == 0 else WRITE_CASES[::-1])
        return {"master": master, "figures": figures | writes, "cpu": cpu | write_cpu, "partitions": partitions}
    finally:
        spark.stop()


def measure(directory: Path, args: argparse.Namespace) -> Report:
    import trio

    from benchmarks.harness.stores import write_segment
    from tierfs import StoreConfig, open_store
    from tierfs.testing.harness import start_daemon

    payload, events = make_events(args.size_mib * MiB)
    (directory / "events.json").write_bytes(payload)
    cut = payload.rfind(b"\n", 0, SAMPLE_BYTES) + 1
    (directory / "sample.json").write_bytes(payload[: cut or len(payload)])
    print(f"{len(payload) / MiB:.0f} MiB of events ({events} lines); writing the segment ...", file=sys.stderr, flush=True)

    async def write(payload: bytes) -> None:
        async with open_store(StoreConfig(data_dir=directory / "data")) as store:
            await write_segment(store, SEGMENT, payload)

    trio.run(write, payload)
    size = len(payload)
    del payload
    daemon = start_daemon(directory / "data", drop_tierfs_env=True, log_path=directory / "daemon.log", verbose=False,
                          timeout_s=DAEMON_TIMEOUT_S)
    client = daemon.client()
    partition_bytes = None if args.partition_mib is None else args.partition_mib * MiB
    try:
        rounds = [[session_round(master, index, directory, size, events, partition_bytes, client)
                   for master in (MASTERS if index % 2 == 0 else MASTERS[::-1])] for index in range(args.rounds)]
    finally:
        client.close()
        daemon.stop(timeout_s=DAEMON_TIMEOUT_S)
    return report(size, events, rounds)


def report(size: int, events: int, rounds: list[list[dict[str, Any]]]) -> Report:
    sessions = {master: [s for r in rounds for s in r if s["master"] == master] for master in MASTERS}
    pairs = list(zip(sessions["local[1]"], sessions["local[2]"], strict=True))

    def mb(session: dict[str, Any], case: str) -> float:
        return float(session["figures"][case].mb_per_s)

    def ratio(ours: str, theirs: str, master: str, rows: bool = False) -> list[float]:
        """Per session: ``ours`` / ``theirs`` (in rows per second: their time over ours)."""
        return [(s["figures"][theirs].seconds / s["figures"][ours].seconds) if rows else mb(s, ours) / mb(s, theirs)
                for s in sessions[master]]

    def scaling(case: str) -> list[float]:
        return [mb(two, case) / mb(one, case) for one, two in pairs]

    checks = []
    for master in MASTERS:
        for ours, theirs in (("j", "J"), ("l", "T")):
            checks.append(Check.over(f"({ours})/({theirs}) {master}", ratio(ours, theirs, master), 1.0, True))
            checks.append(Check.over(f"({ours})/({theirs}) {master}, floor", ratio(ours, theirs, master), 0.7, True))
    checks += [Check.over(f"({case}) local[2]/local[1]", scaling(case), 1.6, True) for case in ("j", "l")]
    checks += [Check.over(f"(w)/(W) {master}, rows/s", ratio("w", "W", master, rows=True), 0.5, True)
               for master in MASTERS]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):6.3f} x"

    bounds = [f"({case}) {LABELS[case]:<20} local[2]/local[1] {median(scaling(case))}"
              for case in ("J", "T", "m", "n", *WRITE_CASES)]
    for master in MASTERS:
        bounds += [f"({ours})/({memory}) {master}: {median(ratio(ours, memory, master))} the Python data source ceiling"
                   for ours, memory in (("j", "m"), ("l", "n"), ("J", "m"), ("T", "n"))]
        bounds += [f"(k)/(J) {master}: {median(ratio('k', 'J', master))} with parse_threads 2",
                   f"(p)/(T) {master}: {median(ratio('p', 'T', master))} with path and offset columns",
                   f"(w)/(o) {master}: {median(ratio('w', 'o', master, True))} and (W)/(o) "
                   f"{median(ratio('W', 'o', master, True))} the rows alone (noop sink), rows/s",
                   f"(w)/(x) {master}: {median(ratio('w', 'x', master, True))}, (e)/(x) "
                   f"{median(ratio('e', 'x', master, True))} and (W)/(x) {median(ratio('W', 'x', master, True))} "
                   "the Python writer ceiling, rows/s"]
    bounds += cpu_lines(size, rounds, pairs)
    rows = [[str(i), s["master"], *(mb(s, c) for c in CASES)] for i, r in enumerate(rounds, 1) for s in r]
    rows += [["median", master, *(statistics.median(mb(s, c) for s in sessions[master]) for c in CASES)]
             for master in MASTERS]
    title = (f"spark events benchmark: {size / MiB:.0f} MiB of JSON events ({events} lines), tier-2 on local disk, "
             f"{rounds[0][0]['partitions']} tierfs partitions; MB/s")
    return Report(title, [table(["round", "master", *(f"({c})" for c in CASES)], rows),
                          [f"({c}) {LABELS[c]}" for c in CASES], bounds], checks, {"rounds": rounds, "bounds": bounds})


def cpu_lines(size: int, rounds: list[list[dict[str, Any]]], pairs: list[tuple[dict[str, Any], dict[str, Any]]]
              ) -> list[str]:
    """Where each timed job's CPU went (per MiB), and the bounds it sets: (j)/(J) at most
    the machine's cores running all of (j)'s CPU against (J)'s time, and one Python worker
    thread per task slot (pyarrow's parse and the hand-over run on the worker's main thread
    unless ``parse_threads`` > 1); local[2]/local[1] at most the cores running the local[2]
    job's CPU against the local[1] time; (w)/(W) at most the cores running (w)'s CPU
    against (W)'s time."""
    def busy(session: dict[str, Any], case: str) -> float:
        return max(float(sum(session["cpu"][case].values())), 1e-9)

    lines = ["read jobs, CPU per MiB of events, by process:"]
    found: dict[str, list[tuple[float, float]]] = {}
    writes = ["write jobs, CPU per MiB of tierfs's output, by process:"]
    write_bounds: dict[str, list[float]] = {}
    for index, sessions in enumerate(rounds, start=1):
        for s in sessions:
            lines += [f"  round {index} {s['master']} ({case}): "
                      f"{describe_per_mib(s['cpu'][case], size, s['figures'][case].seconds)}" for case in READ_CASES]
            slots = int(s["master"][len("local["):-1])
            for ours, theirs in (("j", "J"), ("l", "T")):
                theirs_s = s["figures"][theirs].seconds
                found.setdefault(f"({ours})/({theirs}) {s['master']}", []).append(
                    (CORES * theirs_s / busy(s, ours), slots * theirs_s / max(s["cpu"][ours][WORKERS], 1e-9)))
            writes += [f"  round {index} {s['master']} ({case}): {describe_per_mib(s['cpu'][case], s['figures']['w'].nbytes, s['figures'][case].seconds)}"
                       for case in ("w", "e", "x", "W")]
            write_bounds.setdefault(s["master"], []).append(CORES * s["figures"]["W"].seconds / busy(s, "w"))
    lines += [f"bound on {target}: {CORES} cores running its CPU " + ", ".join(f"{c:.2f}" for c, _ in values)
              + "; one worker thread per slot " + ", ".join(f"{w:.2f}" for _, w in values)
              for target, values in found.items()]
    lines += [f"bound on ({case}) local[2]/local[1]: {CORES} cores running the local[2] job's CPU, against the local[1] "
              "time " + ", ".join(f"{CORES * one['figures'][case].seconds / busy(two, case):.2f}" for one, two in pairs)
              for case in ("j", "l")]
    writes += [f"bound on (w)/(W) {master}: {CORES} cores running (w)'s CPU, against (W)'s time = "
               + ", ".join(f"{v:.2f}" for v in values) + f" (median {statistics.median(values):.2f})"
               for master, values in write_bounds.items()]
    return lines + writes
