"""Spark benchmark. Scenario ``raw`` (default, below): a batch read of a segment whose
chunks are in S3, through the tierfs data source with 1 and with 2 executor cores, next
to s3fs reading the same chunk objects in one process, in one run. Scenario ``events``
(``--scenario events``, ``benchmarks/spark_events.py``): JSON events through
``format("json")`` and ``format("lines")`` next to ``spark.read.json`` /
``spark.read.text`` of the same bytes in a local file, and the same rows written through
``format("tierfs")`` next to ``df.write.json`` to a local directory
(``benchmarks/spark_writes.py``).

One run starts its own S3-protocol server, s3rver (npm, see ``benchmarks/s3server.py``),
on 127.0.0.1 with its data in the scratch directory ``tmp-tierfs-bench-*`` under ``--dir``
(default: the current directory; RAM filesystems are refused). Set-up (untimed): a
segment of ``--size-mib`` MiB (default 1024) by 1 MiB appends into a store whose tier-2
is ``s3://tierfs-bench/chunks`` on that server (64 MiB chunks), flushed; then a tierfs
daemon on that store, and a SparkSession per core count (PySpark, ``local[N]``).

Each of ``--rounds`` rounds (default 2) measures, with the order of (a) and (b)
alternating between rounds:

- (a) ``spark.read.format("tierfs").option("format", "raw")`` with ``local[1]``:
  ``sum(length(value))`` over 1 MiB rows, 64 MiB partitions along the chunks; executors
  read the chunk objects directly (``chunk_storage_options``), 4 MiB at a time as
  parallel 1 MiB ranged GETs, and check every block's CRC32C; the sum must equal the
  size;
- (b) the same with ``local[2]``;
- (c) the I/O ceiling: s3fs ``cat_ranges`` of the same 1 MiB ranges of the chunk
  objects, 16 in flight, in one process (no CRC, no Spark);
- (d1), (d2) the Spark ceiling, in the same sessions as (a) and (b): a Python data
  source with the same schema and partition count whose executors yield Arrow
  batches of four 1 MiB rows from memory, as the tierfs source does
  (``benchmarks/spark_ceiling.py``): what moving rows from Python workers into the
  JVM costs here.

Every Spark figure is the second of two identical jobs in its session (the first runs
at a fraction of the speed while the JVM compiles and the workers start); the driver
binds to 127.0.0.1. Reported: (b)/(a), how the read scales from one executor core to
two, (a)/(c), (b)/(c) and (a)/(d1), (b)/(d2); the CPU every process spent on each timed
job of (a), (b) and (c), per MiB (``process_cpu``), and the bounds it sets: (b)/(c) <=
(c)'s CPU / (b)'s, (b)/(a) <= 2 cores running (b)'s CPU against (a)'s time. Targets
(issue 19): (b)/(c) >= 0.8 (raw against one s3fs process) and (b)/(a) >= 1.6.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

from benchmarks.common import (
    Check,
    MiB,
    Throughput,
    add_size_rounds_arguments,
    format_checks,
    make_payload,
    print_sections,
    run_size_rounds,
)

HELP = ("Spark reads with 1 and 2 executor cores: raw from S3 vs s3fs (s3rver), or JSON events "
        "vs spark.read.json/text and writes vs df.write.json (--scenario events)")
BUCKET = "tierfs-bench"
SEGMENT = "bench/read"  # what ``read.write_segment`` writes
DAEMON_START_TIMEOUT_S = 60.0  # the daemon opens a store whose tier-2 is s3rver
DAEMON_STOP_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Round:
    one_core: Throughput
    two_cores: Throughput
    s3fs: Throughput
    memory_one_core: Throughput  # (d) Spark's Python data source path, no I/O
    memory_two_cores: Throughput
    # CPU seconds by kind of process (``process_cpu``) during the timed job of (a), (b), (c)
    cpu_one_core: dict[str, float]
    cpu_two_cores: dict[str, float]
    cpu_s3fs: dict[str, float]

    def cpu_bound(self) -> float:
        """(b)/(c) when both are CPU-bound on the same cores: (c)'s CPU over (b)'s."""
        return sum(self.cpu_s3fs.values()) / max(sum(self.cpu_two_cores.values()), 1e-9)

    def scaling_bound(self, cores: int = 2) -> float:  # (b) is local[2]: two executor cores
        """(b)/(a) at most: (b) cannot go faster than ``cores`` cores running its CPU per
        byte, so (b)/(a) <= cores x (a)'s time / (b)'s CPU."""
        return cores * self.one_core.seconds / max(sum(self.cpu_two_cores.values()), 1e-9)


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    chunks: int
    partitions: int
    rounds: list[Round]

    def median(self, field: str) -> float:
        return float(statistics.median(getattr(r, field).mb_per_s for r in self.rounds))


def _timed_sum(frame: Any, size: int, cpu: dict[str, float] | None = None) -> float:
    """The second of two ``sum(length(value))`` jobs (the first warms the session up);
    ``cpu`` gets the CPU every process spent during it, by kind."""
    from benchmarks import process_cpu

    frame.selectExpr("sum(length(value))").collect()
    cpu_before = process_cpu.snapshot()
    started = perf_counter()
    total = frame.selectExpr("sum(length(value))").collect()[0][0]
    seconds = perf_counter() - started
    if cpu is not None:
        cpu.update(process_cpu.spent(cpu_before, process_cpu.snapshot()))
    if total != size:
        raise RuntimeError(f"the data source read {total} bytes of {size}")
    return seconds


def _spark_read_seconds(
    master: str, data_dir: Path, storage: dict[str, Any], size: int, cpu: dict[str, float]
) -> tuple[float, float, int]:
    """Wall time of one full read with a fresh ``local[N]`` session, after one untimed
    read (the first job of a session runs at a fraction of the speed while the JVM
    compiles and Python workers start); the same for the in-memory source with as many
    partitions; and the partitions."""
    from benchmarks.spark_ceiling import MemorySource
    from benchmarks.spark_events import new_session
    from tierfs.spark.source import register

    spark = new_session(master)
    try:
        register(spark)
        spark.dataSource.register(MemorySource)
        frame = (spark.read.format("tierfs").option("format", "raw").option("data_dir", str(data_dir))
                 .option("chunk_storage_options", json.dumps(storage)).load(f"tierfs://{SEGMENT}"))
        partitions = frame.rdd.getNumPartitions()
        memory = (spark.read.format("tierfs-bench-memory").option("size", str(size))
                  .option("partitions", str(partitions)).load())
        return _timed_sum(frame, size, cpu), _timed_sum(memory, size), partitions
    finally:
        spark.stop()


def _s3fs_seconds(storage: dict[str, Any], layout: list[dict[str, Any]], size: int,
                  cpu: dict[str, float]) -> float:
    from benchmarks import process_cpu
    from benchmarks.read import raw_cat_ranges

    cpu_before = process_cpu.snapshot()
    ceiling = raw_cat_ranges(storage, layout)
    cpu.update(process_cpu.spent(cpu_before, process_cpu.snapshot()))
    if ceiling.nbytes != size:
        raise RuntimeError(f"s3fs returned {ceiling.nbytes} of {size} bytes")
    return ceiling.seconds


def _measure(directory: Path, size: int, rounds: int, log: TextIO) -> Results:
    import trio

    from benchmarks.read import write_segment
    from benchmarks.s3server import s3_server
    from tierfs import StoreConfig
    from tierfs.testing.harness import start_daemon

    with s3_server(directory / "s3rver", log) as endpoint:
        endpoint.create_bucket(BUCKET)
        storage = endpoint.storage_options()
        data_dir = directory / "data"
        config = StoreConfig(data_dir=data_dir, tier2_url=f"s3://{BUCKET}/chunks", tier2_options=storage)
        print(f"s3rver at {endpoint.url}; writing {size // MiB} MiB ...", file=log, flush=True)
        layout = trio.run(write_segment, config, make_payload(size, seed=7))
        config_file = directory / "tierfs.toml"
        config_file.write_text(
            f'tier2_url = "s3://{BUCKET}/chunks"\n[tier2_options]\n'
            + "".join(f'{key} = "{value}"\n' for key, value in storage.items())
        )
        daemon = start_daemon(data_dir, config_file=config_file, drop_tierfs_env=True,
                              log_path=directory / "daemon.log", verbose=False,
                              timeout_s=DAEMON_START_TIMEOUT_S)
        print(f"daemon up on {daemon.socket}", file=log, flush=True)
        try:
            measured = []
            partitions = 0
            for index in range(rounds):
                order = ["local[1]", "local[2]"] if index % 2 == 0 else ["local[2]", "local[1]"]
                seconds: dict[str, float] = {}
                memory: dict[str, float] = {}
                cpu: dict[str, dict[str, float]] = {"local[1]": {}, "local[2]": {}, "s3fs": {}}
                for master in order:
                    seconds[master], memory[master], partitions = _spark_read_seconds(
                        master, data_dir, storage, size, cpu[master])
                    print(f"round {index + 1}: {master} {size / seconds[master] / 1e6:.0f} MB/s",
                          file=log, flush=True)
                ceiling_s = _s3fs_seconds(storage, layout, size, cpu["s3fs"])
                print(f"round {index + 1}: s3fs {size / ceiling_s / 1e6:.0f} MB/s", file=log, flush=True)
                measured.append(Round(Throughput.of("tierfs data source, local[1]", size, seconds["local[1]"]),
                                      Throughput.of("tierfs data source, local[2]", size, seconds["local[2]"]),
                                      Throughput.of("s3fs cat_ranges, one process", size, ceiling_s),
                                      Throughput.of("memory source, local[1]", size, memory["local[1]"]),
                                      Throughput.of("memory source, local[2]", size, memory["local[2]"]),
                                      cpu["local[1]"], cpu["local[2]"], cpu["s3fs"]))
        finally:
            daemon.stop(timeout_s=DAEMON_STOP_TIMEOUT_S)
    return Results(size, len(layout), partitions, measured)


def ratios(results: Results) -> dict[str, float]:
    """The ratios, medians over the rounds."""
    one, two, ceiling = results.median("one_core"), results.median("two_cores"), results.median("s3fs")
    return {"(b)/(a) scaling, 2 cores vs 1": two / one,
            "(a)/(c) local[1] vs s3fs one process": one / ceiling,
            "(b)/(c) local[2] vs s3fs one process": two / ceiling,
            "(a)/(d1) local[1] vs memory source": one / results.median("memory_one_core"),
            "(b)/(d2) local[2] vs memory source": two / results.median("memory_two_cores")}


def raw_checks(figures: dict[str, float]) -> list[Check]:
    return [Check("(b)/(c) local[2] vs s3fs", figures["(b)/(c) local[2] vs s3fs one process"], 0.8, True, "x"),
            Check("(b)/(a) 2 cores vs 1", figures["(b)/(a) scaling, 2 cores vs 1"], 1.6, True, "x")]


def print_report(machine: dict[str, Any], results: Results, figures: dict[str, float], out: TextIO) -> None:
    header = [
        f"spark benchmark: {results.size_bytes // MiB} MiB segment in {results.chunks} chunk objects "
        f"on s3rver (127.0.0.1), {results.partitions} partitions, raw 1 MiB rows, executors read S3 directly",
        f"machine: {machine}",
    ]
    rows = [f"{'round':<6} {'(a) local[1]':>13} {'(b) local[2]':>13} {'(c) s3fs':>9} "
            f"{'(d1) mem[1]':>12} {'(d2) mem[2]':>12}   MB/s"]
    for i, r in enumerate(results.rounds, start=1):
        rows.append(f"{i:<6} {r.one_core.mb_per_s:13.0f} {r.two_cores.mb_per_s:13.0f} {r.s3fs.mb_per_s:9.0f} "
                    f"{r.memory_one_core.mb_per_s:12.0f} {r.memory_two_cores.mb_per_s:12.0f}")
    medians = [f"{name:<40} {value:6.3f} x (median of {len(results.rounds)} rounds)"
               for name, value in figures.items()]
    print_sections([header, rows, medians, cpu_lines(results), format_checks(raw_checks(figures), 30)], out)


def cpu_lines(results: Results) -> list[str]:
    """Where each timed job's CPU went, and the bounds it sets on the two targets."""
    from benchmarks.process_cpu import describe_per_mib

    lines = ["CPU per MiB read during each timed job, by process (this process: the driver; in (c), s3fs):"]
    for i, r in enumerate(results.rounds, start=1):
        for label, cpu, figure in (("(a)", r.cpu_one_core, r.one_core), ("(b)", r.cpu_two_cores, r.two_cores),
                                   ("(c)", r.cpu_s3fs, r.s3fs)):
            lines.append(f"  round {i} {label}: {describe_per_mib(cpu, results.size_bytes, figure.seconds)}")
    lines.append("bound on (b)/(c), both CPU-bound on these cores: (c)'s CPU / (b)'s = "
                 + ", ".join(f"{r.cpu_bound():.2f}" for r in results.rounds)
                 + f" (median {statistics.median(r.cpu_bound() for r in results.rounds):.2f})")
    lines.append("bound on (b)/(a): 2 cores running (b)'s CPU per MiB, against (a)'s time = "
                 + ", ".join(f"{r.scaling_bound():.2f}" for r in results.rounds)
                 + f" (median {statistics.median(r.scaling_bound() for r in results.rounds):.2f})")
    return lines


def report_json(machine: dict[str, Any], results: Results, figures: dict[str, float]) -> dict[str, Any]:
    from benchmarks.common import checks_json

    return {"machine": machine, "results": dataclasses.asdict(results), "ratios": figures,
            "bounds": {"(b)/(c) cpu": [r.cpu_bound() for r in results.rounds],
                       "(b)/(a) cores": [r.scaling_bound() for r in results.rounds]},
            "checks": checks_json(raw_checks(figures))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=("raw", "events"), default="raw",
                        help="raw: 1 MiB rows from S3 vs s3fs (default); events: JSON events as json "
                        "and lines vs spark.read.json/text of a local file")
    parser.add_argument("--partition-mib", type=int, default=None,
                        help="events: tierfs partition_bytes in MiB (default: the data source's "
                        "own, 64 MiB)")
    add_size_rounds_arguments(parser, 1024, 2, "store, S3 server data or event files")


def run(args: argparse.Namespace) -> int:
    if args.scenario == "events":
        from benchmarks import spark_events
        from tierfs.spark.read import DEFAULT_PARTITION_BYTES

        if args.partition_mib is not None and args.partition_mib < 1:
            print("--partition-mib must be >= 1", file=sys.stderr)
            return 2
        partition_bytes = DEFAULT_PARTITION_BYTES if args.partition_mib is None else args.partition_mib * MiB
        return run_size_rounds(
            "spark events", args, lambda directory, size, rounds: spark_events.measure(
                directory, size, rounds, partition_bytes, sys.stderr),
            spark_events.checks, spark_events.print_report, spark_events.report_json, errors=(RuntimeError,),
        )
    from benchmarks.s3server import S3ServerError

    return run_size_rounds(
        "spark", args, lambda directory, size, rounds: _measure(directory, size, rounds, sys.stderr),
        ratios, print_report, report_json, errors=(S3ServerError, RuntimeError),
    )
