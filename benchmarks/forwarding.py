"""Forwarded appends: what a writer gets through a daemon that does not own its segment,
next to the same writers through the owner (the ceiling), in the same run.

Two cluster daemons on one PostgreSQL; every segment is owned by daemon 0. 1 KiB PD
appends for ``--seconds`` by writer processes (one ``TierClient`` each, appends one
after another), in three shapes: one writer; eight writers on one segment; eight writers
on eight segments. Each shape runs through the owner and through daemon 1, which
forwards every append to the owner (one unconditional append per append: the owner
assigns the offset). The two alternate ``--runs`` times; the figure is the worst ratio.
Target (issue 36): forwarded >= 0.8x the owner's rate in every shape.

Bound: on one machine both daemons and all writers share its cores, so a forwarded
append costs a second daemon's CPU (its HTTP server and client) on the same cores; the
report gives the CPU seconds each daemon used per 1,000 appends beside the rates.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.cluster import cluster, run_writers, segment_of
from benchmarks.harness.figures import Check
from benchmarks.harness.scenario import Report, alternate, table
from tierfs.testing.postgres import PostgresServer

HELP = "appends through a daemon that does not own the segment, against the owner"
TARGET_RATIO = 0.8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per shape and path")
    parser.add_argument("--runs", type=int, default=3, help="alternations of the owner and the forwarder")
    parser.add_argument("--writers", type=int, default=8, help="writers of the many-writer shapes")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(directory: Path, args: argparse.Namespace) -> Report:
    one, many, spread = "1 writer", f"{args.writers} writers, one segment", f"{args.writers} writers, {args.writers} segments"
    shapes = {one: 1, many: args.writers, spread: args.writers}
    rates: dict[str, dict[str, list[float]]] = {shape: {"owner": [], "forwarded": []} for shape in shapes}
    cpu_per_k: dict[str, dict[str, list[float]]] = {shape: {"owner": [], "forwarded": []} for shape in shapes}
    with PostgresServer() as server, cluster(directory, server, "fw", 2, flush_interval_s=1.0) as (nodes, owners):
        client = nodes.client(0)
        names = {shape: [segment_of(nodes, owners, 0, f"s{s}-w{w}", w) for w in range(count)]
                 for s, (shape, count) in enumerate(shapes.items())}
        names[many] = [names[many][0]] * args.writers  # all on one segment
        for segment in {name for group in names.values() for name in group}:
            client.create(segment, parents=True)
        client.close()
        pids = [nodes.daemons[index].proc.pid for index in (0, 1)]
        for run in range(args.runs):
            for shape in shapes:
                for path in alternate(run, ["owner", "forwarded"]):
                    url = nodes.daemons[0 if path == "owner" else 1].url
                    before = sum(_cpu_s(pid) for pid in pids)
                    rate = run_writers([(url, name) for name in names[shape]], args.seconds)
                    used = sum(_cpu_s(pid) for pid in pids) - before
                    rates[shape][path].append(rate)
                    cpu_per_k[shape][path].append(used / max(1.0, rate * args.seconds) * 1000)
    worst = {shape: min(f / o for f, o in zip(r["forwarded"], r["owner"], strict=True)) for shape, r in rates.items()}
    rows = [[shape, f"{min(r['owner']):,.0f}..{max(r['owner']):,.0f}",
             f"{min(r['forwarded']):,.0f}..{max(r['forwarded']):,.0f}", f"{worst[shape]:.2f}",
             f"{max(cpu_per_k[shape]['owner']):.2f} / {max(cpu_per_k[shape]['forwarded']):.2f}"]
            for shape, r in rates.items()]
    section = table([f"1 KiB PD appends, {args.seconds:g} s x {args.runs} runs (appends/s)", "through the owner",
                     "forwarded", "worst ratio", "daemons' CPU-s per 1,000 (owner / forwarded)"], rows)
    checks = [Check(f"forwarded / owner, {shape} (worst of {args.runs})", worst[shape], TARGET_RATIO, True, "x")
              for shape in shapes]
    return Report("forwarded appends", [section], checks, {"rates": rates, "cpu_s_per_1000": cpu_per_k})
