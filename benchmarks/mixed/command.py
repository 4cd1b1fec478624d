"""Mixed load: the daemon's memory under writers, followers and random readers at once,
against the memory its configuration budgets (issue 19, item 6).

One ``tierfs serve`` (default configuration, tier-2 in its data dir) and, in their own
processes (``client.py``): ``--writers`` (3) appending seeded 64 KiB-1 MiB records through
``tierfs://`` until ``--total-mib`` (1,024) are acknowledged in all, ``--followers`` (4)
following the writers' segments (``TierFileSystem.follow``), and ``--readers`` (2)
reading random 64 KiB ranges of what is durable through the daemon until the writers and
followers are done. The daemon's RSS is sampled every 0.5 s from /proc. Afterwards every
segment is read back and compared with what its writer acknowledged, and what each
follower received with the same prefix of the segment.

The bound: block cache + tail memory + read-ahead window + one flush (the configured
budgets) + 150 MiB (the issue's allowance for the interpreter and everything else).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.harness.figures import Check, MiB
from benchmarks.harness.procfs import memory_bytes
from benchmarks.harness.scenario import Report, add_scratch_arguments, run_scenario

HELP = "daemon RSS under writers, followers and random readers at once vs its configured budgets"
SLACK_MIB = 150
SAMPLE_INTERVAL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser)
    parser.add_argument("--total-mib", type=int, default=1024, help="bytes the writers append in all")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--followers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=2)


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs.fsspec_impl import TierFileSystem

    from tierfs import StoreConfig
    from tierfs.testing.harness import start_daemon

    config = StoreConfig(data_dir=directory / "data")
    budget_mib = (config.block_cache_bytes + config.tail_memory_bytes + config.readahead_max_bytes
                  + config.max_flush_bytes) / MiB
    daemon = start_daemon(config.data_dir, verbose=False)
    samples: list[tuple[int, dict[str, float]]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            try:
                samples.append((memory_bytes(daemon.pid)["VmRSS"], daemon.metrics()))
            except Exception:  # noqa: BLE001 - the daemon is stopping
                return
            time.sleep(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    quota, data_dir = args.total_mib * MiB // args.writers, str(config.data_dir)
    segments = [f"mixed/w{w}" for w in range(args.writers)]

    def client(*role: object) -> subprocess.Popen[str]:
        return subprocess.Popen(child_command("benchmarks.mixed.client", data_dir, *map(str, role)),
                                env=child_environment(), stdout=subprocess.PIPE, text=True)

    started = time.monotonic()
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
    contents = {segment: fs.cat_file(segment) for segment in written}
    mismatches = sum(len(contents[s]) != length or hashlib.sha256(contents[s]).hexdigest() != digest
                     for s, (length, digest) in written.items())
    mismatches += sum(hashlib.sha256(contents[o["segment"]][:o["bytes"]]).hexdigest() != o["sha256"]
                      for o in outcomes if o["role"] == "follower")  # it stopped at the writer's quota: a prefix
    daemon.stop()
    rss = [rss_bytes / MiB for rss_bytes, _ in samples]
    at_peak = max(samples, key=lambda s: s[0])[1] if samples else {}
    figures: dict[str, Any] = {
        "elapsed_s": elapsed_s, "peak_mib": max(rss, default=0.0), "samples": len(rss),
        "settled_mib": statistics.median(rss[len(rss) * 2 // 3:]) if rss else 0.0, "budget_mib": budget_mib,
        "at_peak_mib": {key: at_peak.get(f"tierfs_{key}", 0.0) / MiB
                        for key in ("cache_bytes", "tail_memory_bytes", "flush_backlog_bytes")},
        "mismatches": mismatches, "bytes": sum(n for n, _ in written.values())}
    lines = [f"daemon RSS: peak {figures['peak_mib']:.0f} MiB, settled {figures['settled_mib']:.0f} MiB; configured "
             f"budgets {budget_mib:.0f} MiB, bound {budget_mib + SLACK_MIB:.0f} MiB",
             "at the peak: " + ", ".join(f"{key} {mib:.0f} MiB" for key, mib in figures["at_peak_mib"].items()),
             f"every byte compared: {mismatches} segments or followers differ"]
    checks = [Check("peak RSS", figures["peak_mib"], budget_mib + SLACK_MIB, False, "MiB"),
              Check("segments/followers that differ", mismatches, 0, False)]
    title = (f"mixed load: {args.writers} writers ({figures['bytes'] / MiB:,.0f} MiB acknowledged), {args.followers} "
             f"followers, {args.readers} readers of random 64 KiB, {elapsed_s:.0f} s")
    return Report(title, [lines], checks, figures)


def run(args: argparse.Namespace) -> int:
    return run_scenario("mixed", args, lambda directory: measure(directory, args))
