"""Spark benchmark. Scenario ``raw`` (default): a batch read of a segment whose chunks are in
S3 (s3rver) through the tierfs data source with 1 and 2 executor cores, next to s3fs
reading the same objects in one process. Scenario ``events`` (``events.py``): JSON
events read and written next to Spark's own readers and writer of a local file.

Raw: a ``--size-mib`` (1024) MiB segment (64 MiB chunks) on s3rver, a tierfs daemon on
its store, a fresh ``local[N]`` session per figure. Each of ``--rounds`` (2), the order
of (a) and (b) alternating: (a) ``format("tierfs").option("format", "raw")`` at
``local[1]``, ``sum(length(value))`` over 1 MiB rows, executors reading the objects
directly (4 MiB at a time as parallel 1 MiB GETs) and checking every block; (b) the same
at ``local[2]``; (c) the I/O ceiling, s3fs ``cat_ranges`` of the same 1 MiB ranges, 16
in flight, one process; (d1), (d2) the Spark ceiling in (a)'s and (b)'s sessions, a
Python source yielding the same Arrow batches from memory (``ceiling.py``). Each Spark
figure is the second of two identical jobs. Reported: the ratios, the CPU every process
spent per MiB, and its bounds: (b)/(c) <= (c)'s CPU / (b)'s; (b)/(a) <= 2 cores running
(b)'s CPU against (a)'s time. Targets (issue 19): (b)/(c) >= 0.8, (b)/(a) >= 1.6.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import trio

from benchmarks.harness import procfs, s3
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, ratios
from benchmarks.harness.mounts import s3_tier2, serving
from benchmarks.harness.scenario import Report, alternate, positive, rounds_table, say, size_rounds
from benchmarks.harness.stores import write_segment
from benchmarks.spark import events
from tierfs import StoreConfig, open_store

HELP = ("Spark reads with 1 and 2 executor cores: raw from S3 vs s3fs (s3rver), or JSON events "
        "vs spark.read.json/text and writes vs df.write.json (--scenario events)")
SEGMENT = "bench/read"
CASES = {"(a)": "tierfs data source, local[1]", "(b)": "tierfs data source, local[2]",
         "(c)": "s3fs cat_ranges, one process", "(d1)": "memory source, local[1]", "(d2)": "memory source, local[2]"}


def session_round(master: str, data_dir: Path, storage: dict[str, Any], size: int) -> dict[str, Any]:
    """(a) or (b) and (d1) or (d2) in a fresh ``master`` session: seconds, CPU, partitions."""
    from benchmarks.spark.ceiling import MemorySource
    from tierfs.spark.source import register

    spark = events.new_session(master)
    try:
        register(spark)
        spark.dataSource.register(MemorySource)
        frame = (spark.read.format("tierfs").option("format", "raw").option("data_dir", str(data_dir))
                 .option("chunk_storage_options", json.dumps(storage)).load(f"tierfs://{SEGMENT}"))
        partitions = frame.rdd.getNumPartitions()
        memory = (spark.read.format(MemorySource.name()).option("format", "raw").option("rows", str(size // MiB))
                  .option("partitions", str(partitions)).schema("path string, offset long, value binary").load())
        seconds, totals, cpu = events.second_of_two(frame, ["sum(length(value))"])
        if totals[0] != size:
            raise RuntimeError(f"the data source read {totals[0]} bytes of {size}")
        return {"seconds": seconds, "cpu": cpu, "memory_s": events.second_of_two(memory, ["sum(length(value))"])[0],
                "partitions": partitions}
    finally:
        spark.stop()


def measure_raw(directory: Path, args: argparse.Namespace) -> Report:
    size, data_dir = args.size_mib * MiB, directory / "data"
    with s3.s3_server(directory / "s3rver") as endpoint:
        storage = endpoint.storage_options()
        config = StoreConfig(data_dir=data_dir, tier2_url=f"s3://{s3.BUCKET}/chunks", tier2_options=storage)
        say(f"s3rver at {endpoint.url}; writing {args.size_mib} MiB ...")

        async def write() -> s3.Layout:
            async with open_store(config) as store:
                return await write_segment(store, SEGMENT, make_payload(size, seed=7))

        layout, rounds = trio.run(write), []
        with serving(data_dir, s3_tier2(endpoint.url), env=endpoint.environment()):
            for index in range(args.rounds):
                found: dict[str, Any] = {}
                for key, master in alternate(index, [("(a)", "local[1]"), ("(b)", "local[2]")]):
                    found[key] = session_round(master, data_dir, storage, size)
                    say(f"round {index + 1}: {master} {size / found[key]['seconds'] / 1e6:.0f} MB/s")
                before = procfs.cpu_by_kind()
                ceiling = s3.cat_ranges_ceiling(storage, layout, MiB, 16)
                if ceiling.nbytes != size:
                    raise RuntimeError(f"s3fs returned {ceiling.nbytes} of {size} bytes")
                found["(c)"] = {"seconds": ceiling.seconds, "cpu": procfs.spent(before, procfs.cpu_by_kind())}
                found["(d1)"], found["(d2)"] = ({"seconds": found[k]["memory_s"]} for k in ("(a)", "(b)"))
                rounds.append(found)
    return report_raw(size, len(layout), rounds)


def report_raw(size: int, chunks: int, rounds: list[dict[str, Any]]) -> Report:
    columns = {key: [Throughput(label, size, r[key]["seconds"]) for r in rounds] for key, label in CASES.items()}
    cpu_bound = [sum(r["(c)"]["cpu"].values()) / max(sum(r["(b)"]["cpu"].values()), 1e-9) for r in rounds]
    scaling_bound = [2 * r["(a)"]["seconds"] / max(sum(r["(b)"]["cpu"].values()), 1e-9) for r in rounds]
    cpu = ["CPU per MiB read during each timed job, by process (this process: the driver; in (c), s3fs):"]
    cpu += [f"  round {i} {key}: {procfs.describe_per_mib(r[key]['cpu'], size, r[key]['seconds'])}"
            for i, r in enumerate(rounds, 1) for key in ("(a)", "(b)", "(c)")]
    cpu += ["bound on (b)/(c), both CPU-bound on these cores: (c)'s CPU / (b)'s = "
            + ", ".join(f"{v:.2f}" for v in cpu_bound) + f" (median {statistics.median(cpu_bound):.2f})",
            "bound on (b)/(a): 2 cores running (b)'s CPU per MiB, against (a)'s time = "
            + ", ".join(f"{v:.2f}" for v in scaling_bound) + f" (median {statistics.median(scaling_bound):.2f})"]
    checks = [Check.over("(b)/(c) local[2] vs s3fs", ratios(columns["(b)"], columns["(c)"]), 0.8, True),
              Check.over("(b)/(a) 2 cores vs 1", ratios(columns["(b)"], columns["(a)"]), 1.6, True)]
    title = (f"spark benchmark: {size // MiB} MiB segment in {chunks} chunk objects on s3rver (127.0.0.1), "
             f"{rounds[0]['(a)']['partitions']} partitions, raw 1 MiB rows, executors read S3 directly")
    table = rounds_table(columns, [("(b)", "(a)"), ("(a)", "(c)"), ("(b)", "(c)"), ("(a)", "(d1)"), ("(b)", "(d2)")], 0)
    return Report(title, [[f"{key} {label}" for key, label in CASES.items()], table, cpu], checks,
                  {"rounds": rounds, "bounds": {"(b)/(c) cpu": cpu_bound, "(b)/(a) cores": scaling_bound}})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=("raw", "events"), default="raw",
                        help="raw: 1 MiB rows from S3 vs s3fs (default); events: JSON events as json and lines vs "
                        "spark.read.json/text of a local file")
    parser.add_argument("--partition-mib", type=positive, default=None,
                        help="events: tierfs partition_bytes in MiB (default: the data source's own, 64 MiB)")
    size_rounds(parser, 1024, 2)


def measure(directory: Path, args: argparse.Namespace) -> Report:
    if args.scenario == "raw":
        return measure_raw(directory, args)
    return events.measure(directory, args)
