"""Followers benchmark (issue 19, item 8): many ``tail -f`` followers at once.

``--segments`` (10, PD) are each appended 50 times a second for ``--seconds`` (20) with
timestamped 100-byte lines through the daemon's API (a thread and client per segment).
``--followers`` (1,000), spread over the segments and 4 client processes (``child.py``),
connect at once and follow from offset 0 with the streamed follow: a trio task each
(``--clients trio``) or a thread each calling ``TierClient.follow`` (``threads``), on the
daemon's follow or API socket (``--via``). Every follower checks every line (each once,
in order); a line's latency runs from just before its append to its arrival, and for 40
sampled followers from the append's acknowledgement. The ceiling, same run, processes,
followers and lines: a minimal fan-out server (``child.py fanout``: no HTTP, no store, no
durability). Reported for both: lines, errors, the time until every follower had line
0, latency, the append round trip, the server's CPU and RSS, the clients' CPU, how busy
the machine was. Targets: every line to every follower, no errors, p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.followers.child import BUCKET_NS
from benchmarks.harness import procfs
from benchmarks.harness.child import JsonLineChild
from benchmarks.harness.figures import Check, percentile
from benchmarks.harness.mounts import serving
from benchmarks.harness.scenario import Report, UsageError, positive, say, table
from tierfs.contracts.datadir import follow_socket_path
from tierfs.remote.client import TierClient

HELP = "1,000 tail -f followers of 10 segments appended 50 times/s: delivery latency, errors, daemon CPU/RSS"
RATE_PER_S, LINE_BYTES, PROCESSES, SAMPLED_FOLLOWERS = 50.0, 100, 4, 40
READY_TIMEOUT_S, DRAIN_TIMEOUT_S = 120.0, 60.0
Appender = tuple[Callable[[int, bytes], object], Callable[[], None]]  # (append(segment index, line), close)


def line_of(seq: int) -> bytes:
    head = b"%d %d " % (seq, time.monotonic_ns())
    return head + b"x" * max(0, LINE_BYTES - len(head) - 1) + b"\n"


def percentile_ms(histogram: Counter[int], fraction: float) -> float:
    """Upper edge of the histogram bucket holding the nearest-rank percentile."""
    rank, seen = max(1, math.ceil(fraction * sum(histogram.values()))), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return (bucket + 1) * BUCKET_NS / 1e6
    return math.nan


def append_lines(appenders: list[Appender], count: int) -> tuple[list[float], list[list[int]], float]:
    """Lines 1..count to every segment at ``RATE_PER_S`` (a late one goes at once): the
    append latencies, each acknowledgement ([segment][seq - 1], monotonic ns), the seconds."""
    latencies: list[float] = []
    acked_ns: list[list[int]] = [[] for _ in appenders]
    started = time.monotonic()

    def paced(index: int) -> None:
        for seq in range(1, count + 1):
            time.sleep(max(0.0, started + seq / RATE_PER_S - time.monotonic()))
            before = time.monotonic_ns()
            appenders[index][0](index, line_of(seq))
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
    idle_rss, count = procfs.memory_bytes(server_pid)["VmRSS"], max(1, round(RATE_PER_S * args.seconds))
    with contextlib.ExitStack() as stack:
        children = [stack.enter_context(JsonLineChild("benchmarks.followers.child",
                                                      log_path=directory / f"{label}-followers-{i}.log"))
                    for i in range(PROCESSES)]
        say(f"{label}: {args.followers} followers connecting from {PROCESSES} processes ...")
        appenders = [appender_for(index) for index in range(args.segments)]
        for _, close in appenders:
            stack.callback(close)
        assignment = [index % args.segments for index in range(args.followers)]
        for index, child in enumerate(children):
            child.send({"source": label, "address": address, "segments": names, "ready_timeout_s": READY_TIMEOUT_S,
                        "followers": assignment[index::PROCESSES], "clients": args.clients, "via": args.via,
                        "sample_every": max(1, args.followers // SAMPLED_FOLLOWERS)})
        started = time.monotonic()
        for index, (append, _) in enumerate(appenders):
            append(index, line_of(0))
        ready = sum(child.answer()["ready"] for child in children)
        ready_s = time.monotonic() - started
        say(f"{label}: ready in {ready_s:.1f} s; appending for {args.seconds:g} s ...")
        pids = [server_pid, os.getpid()] + [child.process.pid for child in children]
        cpu_before, busy_before = [procfs.cpu_s(pid) for pid in pids], procfs.machine_busy_s()
        append_s, acked_ns, seconds = append_lines(appenders, count)
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

    def summed(key: str) -> int:
        return sum(f[key] for f in finals)

    return {"label": label, "complete": summed("complete"), "lines": summed("lines"), "pieces": summed("pieces"),
            "lines_expected": args.followers * (count + 1), "disorder": summed("disorder"), "errors": dict(errors),
            "ready_s": ready_s, "not_ready": args.followers - ready, "p50_ms": percentile_ms(histogram, 0.5),
            "p99_ms": percentile_ms(histogram, 0.99), "max_ms": (max(histogram, default=-1) + 1) * BUCKET_NS / 1e6,
            "after_ack_p50_ms": percentile(after_ack_ms, 0.5), "after_ack_p99_ms": percentile(after_ack_ms, 0.99),
            "append_seconds": seconds, "appends": len(append_ms), "append_p50_ms": percentile(append_ms, 0.5),
            "append_p99_ms": percentile(append_ms, 0.99), "server_cpu_s": cpu[0], "clients_cpu_s": sum(cpu[2:]),
            "machine_busy_cores": busy_s / seconds, "others_busy_cores": max(0.0, busy_s - sum(cpu)) / seconds,
            "server_rss_idle_bytes": idle_rss, "server_rss_bytes": memory["VmRSS"], "server_peak_rss_bytes": memory["VmHWM"]}


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
    def appender_for(index: int) -> Appender:
        client = TierClient(url)
        return lambda segment, line: client.append(names[segment], line), client.close
    return appender_for


def measure(directory: Path, args: argparse.Namespace) -> Report:
    if args.seconds <= 0:
        raise UsageError("--seconds must be > 0")
    path = str(directory / "fanout.sock")
    with JsonLineChild("benchmarks.followers.child", "fanout", path, log_path=directory / "fanout.log") as fanout:
        fanout.answer()  # listening
        reference = run_phase("reference", args, path, [str(i) for i in range(args.segments)], fanout.process.pid,
                              reference_appender(path), directory)
    with serving(directory / "daemon") as daemon:
        if args.via == "api":  # TierClient.follow streams through the API when there is no follow socket
            follow_socket_path(daemon.data_dir).unlink()
        client, names = daemon.client(), [f"followed/{index}.log" for index in range(args.segments)]
        for name in names:
            client.create(name, durability="pd", parents=True)
        client.close()
        tierfs = run_phase("tierfs", args, daemon.url, names, daemon.pid, tierfs_appender(daemon.url, names), directory)
    figures = [figures_of(p, args.followers) for p in (reference, tierfs)]
    sections = [table(["", "reference", "tierfs"], [[k, figures[0][k], figures[1][k]] for k in figures[0]])]
    sections.append([f"ratios tierfs / reference: p50 {tierfs['p50_ms'] / reference['p50_ms']:.1f}x, p99 "
                     f"{tierfs['p99_ms'] / reference['p99_ms']:.1f}x, server CPU "
                     f"{tierfs['server_cpu_s'] / max(reference['server_cpu_s'], 1e-9):.1f}x, client CPU "
                     f"{tierfs['clients_cpu_s'] / max(reference['clients_cpu_s'], 1e-9):.1f}x"])
    checks = [Check("followers with every line, once, in order", tierfs["complete"], args.followers, True),
              Check("followers that failed (errors)", sum(tierfs["errors"].values()) + tierfs["not_ready"], 0, False),
              Check("append -> follower latency p99", tierfs["p99_ms"], 100.0, False, "ms")]
    title = (f"{args.followers} followers ({args.clients}, via the {args.via} socket) in {PROCESSES} processes, "
             f"{args.segments} segments (PD) appended {RATE_PER_S:g}/s each for {args.seconds:g} s, "
             f"{LINE_BYTES}-byte lines")
    return Report(title, sections, checks, {"options": vars(args), "reference": reference, "tierfs": tierfs})


def figures_of(p: dict[str, Any], followers: int) -> dict[str, str]:
    errors = ", ".join(f"{count} x {message}" for message, count in p["errors"].items()) or "none"
    cpu_per_s, mib = p["server_cpu_s"] / p["append_seconds"], 2**20
    return {
        "followers complete; lines delivered": f"{p['complete']}/{followers}; {p['lines']}/{p['lines_expected']}",
        "deliveries (lines each); out of order": f"{p['pieces']} ({p['lines'] / max(1, p['pieces']):.2f}); {p['disorder']}",
        "errors; not ready; all had line 0 after": f"{errors}; {p['not_ready']}; {p['ready_s']:.2f} s",
        "append -> follower p50/p99/max, ms": f"{p['p50_ms']:.1f}/{p['p99_ms']:.1f}/{p['max_ms']:.1f}",
        f"after the ack ({SAMPLED_FOLLOWERS} followers) p50/p99, ms": f"{p['after_ack_p50_ms']:.1f}/{p['after_ack_p99_ms']:.1f}",
        "appends (/s); round trip p50/p99, ms": f"{p['appends']} ({p['appends'] / p['append_seconds']:.0f}); "
                                                f"{p['append_p50_ms']:.2f}/{p['append_p99_ms']:.2f}",
        "server CPU s (of a core); per follower": f"{p['server_cpu_s']:.1f} ({cpu_per_s:.0%}); "
                                                  f"{cpu_per_s / followers * 1e6:.0f} us/s",
        "server CPU per line; per delivery, us": f"{p['server_cpu_s'] / max(1, p['lines']) * 1e6:.1f}; "
                                                 f"{p['server_cpu_s'] / max(1, p['pieces']) * 1e6:.1f}",
        "client processes CPU s (of a core)": f"{p['clients_cpu_s']:.1f} ({p['clients_cpu_s'] / p['append_seconds']:.0%})",
        "machine's CPUs busy (not this run's), cores": f"{p['machine_busy_cores']:.2f} ({p['others_busy_cores']:.2f})",
        "server RSS MiB (idle, peak); per follower": f"{p['server_rss_bytes'] / mib:.1f} ({p['server_rss_idle_bytes'] / mib:.1f}, "
        f"{p['server_peak_rss_bytes'] / mib:.1f}); "
        f"{(p['server_rss_bytes'] - p['server_rss_idle_bytes']) / followers / 1024:.1f} KiB"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--followers", type=positive, default=1000, help="followers in all (default 1000)")
    parser.add_argument("--segments", type=positive, default=10, help="segments followed (default 10)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of appending (default 20)")
    parser.add_argument("--clients", choices=("trio", "threads"), default="trio",
                        help="followers in each process: a trio task each (default) or a thread each "
                        "(TierClient.follow, as fs.follow and tierfs tail -f)")
    parser.add_argument("--via", choices=("follow", "api"), default="follow",
                        help="the daemon socket the followers stream from: its follow socket (default, what "
                        "TierClient.follow uses on the same host) or its API socket (hypercorn, as over TCP)")
