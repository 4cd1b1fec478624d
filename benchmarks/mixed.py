"""Mixed load: the daemon's memory under writers, followers and random readers at once,
against the memory its configuration budgets (issue 19, item 6).

One ``tierfs serve`` (default configuration, tier-2 in its data dir) and, in their own
processes (``python -m benchmarks.mixed DATA_DIR ROLE ...``): 3 writers appending seeded
64 KiB-1 MiB records through ``tierfs://`` until ``--total-mib`` (1,024) are acknowledged
in all, 4 followers following the writers' segments, and 2 readers reading random 64 KiB
ranges through the daemon (``direct_reads=False``: its cache and read-ahead are part of
the load) until the writers and followers are done. The daemon's RSS is sampled every
0.5 s; afterwards every segment and what each follower received is compared with what
its writer acknowledged. The bound: block cache + tail memory + read-ahead window + one
flush (the configured budgets) + 150 MiB (the issue's allowance for the rest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.harness.figures import Check, MiB
from benchmarks.harness.mounts import serving
from benchmarks.harness.procfs import memory_bytes
from benchmarks.harness.scenario import Report, positive
from tierfs import StoreConfig

HELP = "daemon RSS under writers, followers and random readers at once vs its configured budgets"
SLACK_MIB, SAMPLE_INTERVAL_S = 150, 0.5
WRITERS, FOLLOWERS, READERS = 3, 4, 2
READ_BYTES = 64 << 10


def writer(fs: Any, writer: int, quota_bytes: int) -> dict[str, object]:
    digest, written, index = hashlib.sha256(), 0, 0
    with fs.open(f"mixed/w{writer}", "ab") as f:
        while written < quota_bytes:
            rng = random.Random(writer * 1_000_003 + index)
            data = rng.randbytes(rng.randrange(64 << 10, 1 << 20))
            f.write(data)
            f.flush()  # one atomic append per record
            digest.update(data)
            written, index = written + len(data), index + 1
    return {"role": "writer", "segment": f"mixed/w{writer}", "bytes": written, "sha256": digest.hexdigest()}


def follower(fs: Any, segment: str, expected_bytes: int) -> dict[str, object]:
    digest, seen = hashlib.sha256(), 0
    while not fs.exists(segment):
        time.sleep(0.05)
    for piece in fs.follow(segment):
        digest.update(piece)
        seen += len(piece)
        if seen >= expected_bytes:
            break
    return {"role": "follower", "segment": segment, "bytes": seen, "sha256": digest.hexdigest()}


def reader(fs: Any, reader: int, segments: list[str]) -> dict[str, object]:
    rng, reads, errors, stopping = random.Random(reader), 0, 0, []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    while not stopping:
        segment = rng.choice(segments)
        try:
            size = fs.size(segment)
        except FileNotFoundError:
            size = 0
        if size < READ_BYTES:
            time.sleep(0.05)
            continue
        start = rng.randrange(0, size - READ_BYTES)
        try:
            fs.cat_file(segment, start=start, end=start + READ_BYTES)
            reads += 1
        except Exception:  # noqa: BLE001 - counted and reported, the run goes on
            errors += 1
    return {"role": "reader", "reads": reads, "errors": errors}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--total-mib", type=positive, default=1024, help="bytes the writers append in all")


def run_load(data_dir: str, quota: int) -> list[dict[str, Any]]:
    """The clients' processes until the writers and followers are done: what each reported."""
    segments = [f"mixed/w{w}" for w in range(WRITERS)]

    def client(*role: object) -> subprocess.Popen[str]:
        return subprocess.Popen(child_command("benchmarks.mixed", data_dir, *map(str, role)),
                                env=child_environment(), stdout=subprocess.PIPE, text=True)

    followers = [client("follower", segments[f % WRITERS], quota) for f in range(FOLLOWERS)]
    writers = [client("writer", w, quota) for w in range(WRITERS)]
    readers = [client("reader", r, *segments) for r in range(READERS)]
    outcomes = []
    for process in [*writers, *followers]:
        stdout, _ = process.communicate(timeout=3600)
        if process.returncode != 0:
            raise RuntimeError(f"a mixed-load client failed: {process.args!r}")
        outcomes.append(json.loads(stdout.strip().splitlines()[-1]))
    for process in readers:
        process.terminate()
        process.wait(timeout=60)
    return outcomes


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs.fsspec_impl import TierFileSystem

    config = StoreConfig(data_dir=directory / "data")
    budget_mib = (config.block_cache_bytes + config.tail_memory_bytes + config.readahead_max_bytes
                  + config.max_flush_bytes) / MiB
    samples: list[tuple[int, dict[str, float]]] = []
    with serving(config.data_dir) as daemon:
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(SAMPLE_INTERVAL_S):
                samples.append((memory_bytes(daemon.pid)["VmRSS"], daemon.metrics()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        outcomes = run_load(str(config.data_dir), args.total_mib * MiB // WRITERS)
        elapsed_s = time.monotonic() - started
        sampling.set()
        sampler.join()
        fs = TierFileSystem(data_dir=str(config.data_dir), skip_instance_cache=True)
        written = {o["segment"]: (o["bytes"], o["sha256"]) for o in outcomes if o["role"] == "writer"}
        contents = {segment: fs.cat_file(segment) for segment in written}
    mismatches = sum(len(contents[s]) != length or hashlib.sha256(contents[s]).hexdigest() != digest
                     for s, (length, digest) in written.items())
    mismatches += sum(hashlib.sha256(contents[o["segment"]][:o["bytes"]]).hexdigest() != o["sha256"]
                      for o in outcomes if o["role"] == "follower")  # it stopped at the writer's quota: a prefix
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
    title = (f"mixed load: {WRITERS} writers ({figures['bytes'] / MiB:,.0f} MiB acknowledged), {FOLLOWERS} "
             f"followers, {READERS} readers of random 64 KiB, {elapsed_s:.0f} s")
    return Report(title, [lines], checks, figures)


def run_client(argv: list[str]) -> None:
    """A client process's role (module docstring), its figures as one JSON line."""
    from tierfs.fsspec_impl import TierFileSystem

    data_dir, role = argv[0], argv[1]
    fs = TierFileSystem(data_dir=data_dir, skip_instance_cache=True, direct_reads=role != "reader")
    if role == "writer":
        found = writer(fs, int(argv[2]), int(argv[3]))
    elif role == "follower":
        found = follower(fs, argv[2], int(argv[3]))
    else:
        found = reader(fs, int(argv[2]), argv[3:])
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    run_client(sys.argv[1:])
