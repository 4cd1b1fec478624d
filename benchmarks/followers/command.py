"""Followers benchmark (issue 19, item 8): many ``tail -f`` followers at once.

``--segments`` (10, ``--durability`` pd) are each appended ``--rate`` (50) times a second
for ``--seconds`` (20) with timestamped lines (``<seq> <monotonic ns> <padding>``,
``--line-bytes`` long) through the daemon's API (a thread and client per segment; a late
appender appends at once). ``--followers`` (1,000), spread over the segments and over
``--processes`` (4) client processes (``child.py``), all connect at once and follow from
offset 0 with the streamed follow: a trio task each (``--clients trio``) or a thread each
calling ``TierClient.follow`` (``threads``), on the daemon's follow socket or its API
socket (``--via``). Every follower checks every line (each exactly once, in order); a
line's latency runs from just before its append to its arrival, and for 40 sampled
followers from the append's acknowledgement (the bytes durable).

The ceiling, same run, same processes, followers and lines: a minimal fan-out server
(``fanout.py``: appends acknowledged per line, a trio task per follower sending the growth
of an in-memory log over a Unix socket; no HTTP, no store, no durability).

Reported for both: lines delivered, followers complete, errors, the time until every
follower had line 0, latency p50/p99/max, the append round trip, the server's CPU and RSS
(per follower), the client processes' CPU, and how busy the machine's CPUs were (by
anything: a shared machine). Targets: every line to every follower, no errors, p99 <=
100 ms; the ratios tierfs / reference say what the daemon costs over the minimum.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.followers.child import BUCKET_NS
from benchmarks.harness import procfs
from benchmarks.harness.child import JsonLineChild
from benchmarks.harness.figures import Check, percentile
from benchmarks.harness.scenario import (
    Report,
    UsageError,
    add_scratch_arguments,
    at_least_one,
    run_scenario,
)

HELP = "1,000 tail -f followers of 10 segments appended 50 times/s: delivery latency, errors, daemon CPU/RSS"
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 60.0
SAMPLED_FOLLOWERS = 40
Appender = tuple[Callable[[int, bytes], None], Callable[[], None]]  # (append(segment index, line), close)


def line_of(seq: int, line_bytes: int) -> bytes:
    head = b"%d %d " % (seq, time.monotonic_ns())
    return head + b"x" * max(0, line_bytes - len(head) - 1) + b"\n"


def percentile_ms(histogram: Counter[int], fraction: float) -> float:
    """Upper edge of the histogram bucket holding the nearest-rank percentile."""
    rank, seen = max(1, math.ceil(fraction * sum(histogram.values()))), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return (bucket + 1) * BUCKET_NS / 1e6
    return math.nan


def append_lines(args: argparse.Namespace, appenders: list[Appender]) -> tuple[list[float], list[list[int]], float]:
    """Lines 1..N to every segment at ``--rate`` (a late one goes at once): the append
    latencies, each acknowledgement ([segment][seq - 1], monotonic ns), the seconds."""
    count = max(1, round(args.rate * args.seconds))
    latencies: list[float] = []
    acked_ns: list[list[int]] = [[] for _ in appenders]
    started = time.monotonic()

    def paced(index: int) -> None:
        for seq in range(1, count + 1):
            time.sleep(max(0.0, started + seq / args.rate - time.monotonic()))
            before = time.monotonic_ns()
            appenders[index][0](index, line_of(seq, args.line_bytes))
            acked_ns[index].append(time.monotonic_ns())
            latencies.append((acked_ns[index][-1] - before) / 1e9)

    threads = [threading.Thread(target=paced, args=(index,)) for index in range(len(appenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, acked_ns, time.monotonic() - started


def run_phase(label: str, args: argparse.Namespace, address: str, names: list[str], server_pid: int,
              appender_for: Callable[[int], Appender], directory: Path) -> dict[str, Any]:
    """The load against one server: children follow, appenders append, all checked."""
    idle_rss = procfs.memory_bytes(server_pid)["VmRSS"]
    count = max(1, round(args.rate * args.seconds))
    with contextlib.ExitStack() as stack:
        children = [JsonLineChild("benchmarks.followers.child", log_path=directory / f"{label}-followers-{i}.log")
                    for i in range(args.processes)]
        for child in children:
            stack.callback(child.close)
        print(f"{label}: {args.followers} followers connecting from {args.processes} processes ...", file=sys.stderr,
              flush=True)
        appenders = [appender_for(index) for index in range(args.segments)]
        for _, close in appenders:
            stack.callback(close)
        assignment = [index % args.segments for index in range(args.followers)]
        for index, child in enumerate(children):
            child.send({"source": label, "address": address, "segments": names, "ready_timeout_s": READY_TIMEOUT_S,
                        "followers": assignment[index::args.processes], "clients": args.clients, "via": args.via,
                        "sample_every": max(1, args.followers // SAMPLED_FOLLOWERS)})
        started = time.monotonic()
        for index, (append, _) in enumerate(appenders):
            append(index, line_of(0, args.line_bytes))
        ready = sum(child.answer()["ready"] for child in children)
        ready_s = time.monotonic() - started
        print(f"{label}: ready in {ready_s:.1f} s; appending for {args.seconds:g} s ...", file=sys.stderr, flush=True)
        pids = [server_pid, os.getpid()] + [child.process.pid for child in children]
        cpu_before, busy_before = [procfs.cpu_s(pid) for pid in pids], procfs.machine_busy_s()
        append_s, acked_ns, seconds = append_lines(args, appenders)
        cpu = [procfs.cpu_s(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
        busy_s, memory = procfs.machine_busy_s() - busy_before, procfs.memory_bytes(server_pid)
        finals = [child.request({"last_seq": count, "deadline_s": DRAIN_TIMEOUT_S}) for child in children]
    histogram: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    for final in finals:
        histogram.update({int(bucket): n for bucket, n in final["histogram"].items()})
        errors.update(final["errors"])
    after_ack_ms = sorted((arrived_ns - acked_ns[segment][seq - 1]) / 1e6 for final in finals
                          for segment, seq, arrived_ns in final["samples"])
    append_ms = sorted(s * 1e3 for s in append_s)
    return {"label": label, "complete": sum(f["complete"] for f in finals), "lines": sum(f["lines"] for f in finals),
            "lines_expected": args.followers * (count + 1), "pieces": sum(f["pieces"] for f in finals),
            "disorder": sum(f["disorder"] for f in finals), "errors": dict(errors), "ready_s": ready_s,
            "not_ready": args.followers - ready, "p50_ms": percentile_ms(histogram, 0.5),
            "p99_ms": percentile_ms(histogram, 0.99), "max_ms": (max(histogram, default=-1) + 1) * BUCKET_NS / 1e6,
            "after_ack_p50_ms": percentile(after_ack_ms, 0.5), "after_ack_p99_ms": percentile(after_ack_ms, 0.99),
            "append_seconds": seconds, "appends": len(append_ms), "append_p50_ms": percentile(append_ms, 0.5),
            "append_p99_ms": percentile(append_ms, 0.99), "server_cpu_s": cpu[0], "clients_cpu_s": sum(cpu[2:]),
            "machine_busy_cores": busy_s / seconds, "others_busy_cores": max(0.0, busy_s - sum(cpu)) / seconds,
            "server_rss_idle_bytes": idle_rss, "server_rss_bytes": memory["VmRSS"], "server_peak_rss_bytes": memory["VmHWM"]}


@contextlib.contextmanager
def reference_server(directory: Path) -> Iterator[tuple[str, int]]:
    path = str(directory / "fanout.sock")
    with open(directory / "fanout.log", "wb") as err:
        proc = subprocess.Popen(child_command("benchmarks.followers.fanout", path), stdout=subprocess.PIPE, stderr=err,
                                env=child_environment())
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fan-out reference did not start: {(directory / 'fanout.log').read_text()}")
        yield path, proc.pid
    finally:
        proc.kill()
        proc.wait()


def reference_appender(path: str) -> Callable[[int], Appender]:
    def appender_for(index: int) -> Appender:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(b"A %d\n" % index)

        def append(_index: int, line: bytes) -> None:
            sock.sendall(line)
            if sock.recv(1) != b"+":  # acknowledged, as an append is
                raise RuntimeError("the fan-out reference closed an appender's connection")
        return append, sock.close
    return appender_for


def tierfs_appender(url: str, names: list[str]) -> Callable[[int], Appender]:
    from tierfs.remote.client import TierClient

    def appender_for(index: int) -> Appender:
        client = TierClient(url)

        def append(segment: int, line: bytes) -> None:
            client.append(names[segment], line)
        return append, client.close
    return appender_for


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs.contracts.datadir import follow_socket_path
    from tierfs.testing.harness import start_daemon

    at_least_one(args, "followers", "segments", "processes")
    if args.rate <= 0 or args.seconds <= 0:
        raise UsageError("--rate and --seconds must be > 0")
    with reference_server(directory) as (path, pid):
        reference = run_phase("reference", args, path, [str(i) for i in range(args.segments)], pid,
                              reference_appender(path), directory)
    daemon = start_daemon(directory / "daemon", drop_tierfs_env=True, log_path=directory / "daemon.log", verbose=False)
    try:
        if args.via == "api":  # TierClient.follow streams through the API when there is no follow socket
            follow_socket_path(daemon.data_dir).unlink()
        client, names = daemon.client(), [f"followed/{index}.log" for index in range(args.segments)]
        for name in names:
            client.create(name, durability=args.durability, parents=True)
        client.close()
        tierfs = run_phase("tierfs", args, daemon.url, names, daemon.pid, tierfs_appender(daemon.url, names), directory)
    finally:
        daemon.stop(timeout_s=60.0)
    sections = [phase_lines(p, args.followers) for p in (reference, tierfs)]
    sections.append([f"ratios tierfs / reference: p50 {tierfs['p50_ms'] / reference['p50_ms']:.1f}x, p99 "
                     f"{tierfs['p99_ms'] / reference['p99_ms']:.1f}x, server CPU "
                     f"{tierfs['server_cpu_s'] / max(reference['server_cpu_s'], 1e-9):.1f}x, client CPU "
                     f"{tierfs['clients_cpu_s'] / max(reference['clients_cpu_s'], 1e-9):.1f}x"])
    checks = [Check("followers with every line, once, in order", tierfs["complete"], args.followers, True),
              Check("followers that failed (errors)", sum(tierfs["errors"].values()) + tierfs["not_ready"], 0, False),
              Check("append -> follower latency p99", tierfs["p99_ms"], 100.0, False, "ms")]
    title = (f"{args.followers} followers ({args.clients}, via the {args.via} socket) in {args.processes} processes, "
             f"{args.segments} segments ({args.durability}) appended {args.rate:g}/s each for {args.seconds:g} s, "
             f"{args.line_bytes}-byte lines")
    return Report(title, sections, checks, {"options": vars(args), "reference": reference, "tierfs": tierfs})


def phase_lines(p: dict[str, Any], followers: int) -> list[str]:
    errors = ", ".join(f"{count} x {message}" for message, count in p["errors"].items()) or "none"
    cpu_per_s = p["server_cpu_s"] / p["append_seconds"]
    return [
        f"{p['label']}:",
        f"  followers complete {p['complete']}/{followers}; lines {p['lines']}/{p['lines_expected']} in {p['pieces']} "
        f"deliveries ({p['lines'] / max(1, p['pieces']):.2f} lines each); out of order {p['disorder']}; errors: "
        f"{errors}; not ready {p['not_ready']}; all connected with line 0 after {p['ready_s']:.2f} s",
        f"  latency append -> follower: p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, max {p['max_ms']:.1f} ms; "
        f"after the acknowledgement ({SAMPLED_FOLLOWERS} followers): p50 {p['after_ack_p50_ms']:.1f} ms, p99 "
        f"{p['after_ack_p99_ms']:.1f} ms",
        f"  appends: {p['appends']} in {p['append_seconds']:.1f} s ({p['appends'] / p['append_seconds']:.0f}/s), round "
        f"trip p50 {p['append_p50_ms']:.2f} ms, p99 {p['append_p99_ms']:.2f} ms",
        f"  server CPU {p['server_cpu_s']:.1f} s ({cpu_per_s * 100:.0f}% of a core; per follower "
        f"{cpu_per_s / followers * 1e6:.0f} us/s; {p['server_cpu_s'] / max(1, p['lines']) * 1e6:.1f} us per line, "
        f"{p['server_cpu_s'] / max(1, p['pieces']) * 1e6:.1f} us per delivery); client processes CPU "
        f"{p['clients_cpu_s']:.1f} s ({p['clients_cpu_s'] / p['append_seconds'] * 100:.0f}% of a core)",
        f"  the machine's CPUs busy {p['machine_busy_cores']:.2f} cores, of which {p['others_busy_cores']:.2f} not "
        "this benchmark's",
        f"  server RSS {p['server_rss_bytes'] / 2**20:.1f} MiB (idle {p['server_rss_idle_bytes'] / 2**20:.1f} MiB, "
        f"peak {p['server_peak_rss_bytes'] / 2**20:.1f} MiB): "
        f"{(p['server_rss_bytes'] - p['server_rss_idle_bytes']) / followers / 1024:.1f} KiB per follower"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--followers", type=int, default=1000, help="followers in all (default 1000)")
    parser.add_argument("--segments", type=int, default=10, help="segments followed (default 10)")
    parser.add_argument("--rate", type=float, default=50.0, help="appends per second per segment (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of appending (default 20)")
    parser.add_argument("--processes", type=int, default=4, help="follower processes (default 4)")
    parser.add_argument("--line-bytes", type=int, default=100, help="bytes per line (default 100)")
    parser.add_argument("--durability", choices=("pd", "vd", "tier2"), default="pd",
                        help="durability of the followed segments (default pd)")
    parser.add_argument("--clients", choices=("trio", "threads"), default="trio",
                        help="followers in each process: a trio task each (default) or a thread each "
                        "(TierClient.follow, as fs.follow and tierfs tail -f)")
    parser.add_argument("--via", choices=("follow", "api"), default="follow",
                        help="the daemon socket the followers stream from: its follow socket (default, what "
                        "TierClient.follow uses on the same host) or its API socket (hypercorn, as over TCP)")
    add_scratch_arguments(parser, "the daemon's data dir")


def run(args: argparse.Namespace) -> int:
    return run_scenario("followers", args, lambda directory: measure(directory, args))
