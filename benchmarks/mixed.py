"""Mixed load: the daemon's memory under writers, followers and random readers at once,
against the memory its configuration budgets (issue 19, item 6).

One ``tierfs serve`` (default configuration, tier-2 in its data dir) and, in their own
processes: ``--writers`` (3) appending seeded 64 KiB-1 MiB records through
``tierfs://`` until ``--total-mib`` (1,024) are acknowledged in all, ``--followers`` (4)
following the writers' segments through the daemon (``TierFileSystem.follow``), and
``--readers`` (2) reading random 64 KiB ranges of what is durable (until the writers
and followers are done). The daemon's RSS is
sampled every 0.5 s from /proc. Afterwards every segment is read back and compared
with what its writer acknowledged, and what each follower received (the writer's quota
or a little more) with the same prefix of the segment.

The bound: block cache + tail memory + read-ahead window + one flush (the configured
budgets) + 150 MiB (the issue's allowance for the interpreter and everything else).
Reported: peak and settled (median of the last third) RSS, the bound, bytes compared,
errors. A missed target is reported, not an error: the exit code is 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.common import (
    EXIT_OK,
    Check,
    add_scratch_arguments,
    format_checks,
    make_scratch_directory,
)

HELP = "daemon RSS under writers, followers and random readers at once vs its configured budgets"
MiB = 1 << 20
SLACK_MIB = 150
SAMPLE_INTERVAL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser)
    parser.add_argument("--total-mib", type=int, default=1024, help="bytes the writers append in all")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--followers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run_mix(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    from tierfs.fsspec_impl import TierFileSystem

    from tierfs.contracts.config import StoreConfig
    from tierfs.testing.harness import start_daemon

    config = StoreConfig(data_dir=directory / "data")
    budget_mib = (config.block_cache_bytes + config.tail_memory_bytes + config.readahead_max_bytes
                  + config.max_flush_bytes) / MiB
    daemon = start_daemon(config.data_dir, verbose=False)
    samples: list[tuple[float, int, dict[str, float]]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            try:
                metrics = daemon.metrics()
                samples.append((time.monotonic(), _rss_kib(daemon.pid), metrics))
            except Exception:  # noqa: BLE001 - the daemon is stopping
                return
            time.sleep(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    quota = args.total_mib * MiB // args.writers
    segments = [f"mixed/w{w}" for w in range(args.writers)]
    started = time.monotonic()
    data_dir = str(config.data_dir)

    def client(*role: object) -> subprocess.Popen[str]:
        return subprocess.Popen(child_command("benchmarks.mixed_client", data_dir, *map(str, role)),
                                env=child_environment(), stdout=subprocess.PIPE, text=True)

    followers = [client("follower", segments[f % args.writers], quota) for f in range(args.followers)]
    writers = [client("writer", w, quota) for w in range(args.writers)]
    readers = [client("reader", r, *segments) for r in range(args.readers)]
    outcomes = []
    for process in [*writers, *followers]:
        stdout, _ = process.communicate(timeout=3600)
        if process.returncode != 0:
            raise RuntimeError(f"a mixed-load client failed: {process.args!r}")
        outcomes.append(json.loads(stdout.strip().splitlines()[-1]))
    elapsed_s = time.monotonic() - started
    for process in readers:
        process.terminate()
        process.wait(timeout=60)
    sampling.set()
    sampler.join()
    fs = TierFileSystem(data_dir=data_dir, skip_instance_cache=True)
    written = {o["segment"]: (o["bytes"], o["sha256"]) for o in outcomes if o["role"] == "writer"}
    mismatches = 0
    contents = {}
    for segment, (length, digest) in written.items():
        contents[segment] = data = fs.cat_file(segment)
        mismatches += len(data) != length or hashlib.sha256(data).hexdigest() != digest
    for o in outcomes:
        if o["role"] == "follower":  # it stopped once it had the writer's quota: a prefix
            mismatches += hashlib.sha256(contents[o["segment"]][:o["bytes"]]).hexdigest() != o["sha256"]
    daemon.stop()
    rss = [kib / 1024 for _, kib, _ in samples]
    settled = statistics.median(rss[len(rss) * 2 // 3:]) if rss else 0.0
    at_peak = max(samples, key=lambda s: s[1])[2] if samples else {}
    accounted = {key: at_peak.get(f"tierfs_{key}", 0.0) / MiB
                 for key in ("cache_bytes", "tail_memory_bytes", "flush_backlog_bytes")}
    return {"elapsed_s": elapsed_s, "peak_mib": max(rss, default=0.0), "settled_mib": settled,
            "at_peak_mib": accounted,
            "budget_mib": budget_mib, "bound_mib": budget_mib + SLACK_MIB, "mismatches": mismatches,
            "bytes": sum(n for n, _ in written.values()), "samples": len(rss)}


def run(args: argparse.Namespace) -> int:
    directory = make_scratch_directory(args.dir)
    try:
        figures = run_mix(directory, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out = sys.stdout
    print(f"mixed load: {args.writers} writers ({figures['bytes'] / MiB:,.0f} MiB acknowledged), {args.followers} "
          f"followers, {args.readers} readers of random 64 KiB, {figures['elapsed_s']:.0f} s", file=out)
    print(f"  daemon RSS: peak {figures['peak_mib']:.0f} MiB, settled {figures['settled_mib']:.0f} MiB; configured "
          f"budgets {figures['budget_mib']:.0f} MiB, bound {figures['bound_mib']:.0f} MiB", file=out)
    print("  at the peak: " + ", ".join(f"{key} {mib:.0f} MiB" for key, mib in figures["at_peak_mib"].items()),
          file=out)
    print(f"  every byte compared: {figures['mismatches']} segments or followers differ", file=out)
    checks = [Check("peak RSS", figures["peak_mib"], figures["bound_mib"], at_least=False, unit="MiB"),
              Check("segments/followers that differ", figures["mismatches"], 0, at_least=False)]
    for line in format_checks(checks):
        print(line, file=out)
    return EXIT_OK
