"""Followers benchmark (issue 19, item 8): ``python -m benchmarks followers``.

Many ``tail -f`` followers at once. ``--segments`` segments (10, ``--durability`` pd)
are each appended ``--rate`` times a second (50) for ``--seconds`` (20) with
timestamped lines (``<seq> <monotonic ns> <padding>``, ``--line-bytes`` long), through
the daemon's API (one appender thread and client per segment, in this process; a late
appender appends at once, so the rate reached is reported). ``--followers`` followers
(1,000), spread evenly over the segments and over ``--processes`` client processes (4,
``followers_child``), all connect at once and follow from offset 0 with the streamed
follow: with ``--clients trio`` (default) a trio task per follower
(``followers_async``), with ``--clients threads`` a thread per follower calling
``TierClient.follow`` (what ``tierfs tail -f`` and ``fs.follow`` do); ``--via`` picks the
daemon's follow socket (default, what the client uses on the same host) or its API
socket (hypercorn, as over TCP). Every follower checks every line: each sequence number
exactly once, in order; a line's latency runs from just before its append was sent to
its arrival at the follower, and, for 40 sampled followers, from the append's
acknowledgement (the bytes are durable then) to the arrival.

The ceiling, in the same run with the same processes, followers and lines: a minimal
fan-out server (``fanout_reference``: appends acknowledged per line, a trio task per
follower sending the growth of an in-memory log over a Unix socket; no HTTP, no store,
no durability).

Reported for both: lines delivered, deliveries and followers complete, errors (a
follower whose stream failed, e.g. "daemon overloaded"), time until every follower had
connected and received line 0, latency p50/p99/max, the append round trip, the
server's CPU (per follower per second, per line, per delivery) and RSS (and per
follower, over the idle server), the client processes' CPU, and how busy the machine's
CPUs were, by this benchmark and by anything else (a shared machine). Targets: every
line to every follower, no errors, p99 <= 100 ms. The ratios tierfs/reference say what
the daemon costs over the minimum.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
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
from typing import Any, TextIO

from benchmarks import child_command, child_environment
from benchmarks.children import JsonLineChild
from benchmarks.common import (
    Check,
    add_scratch_arguments,
    checks_json,
    format_checks,
    percentile,
    print_sections,
    run_in_scratch,
)

HELP = "1,000 tail -f followers of 10 segments appended 50 times/s: delivery latency, errors, daemon CPU/RSS"
CHILD_MODULE = "benchmarks.followers_child"
TARGET_P99_MS = 100.0
READY_TIMEOUT_S = 120.0  # every follower connects and gets line 0 within this
DRAIN_TIMEOUT_S = 60.0  # after the last append, every follower has every line within this
STOP_TIMEOUT_S = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
BUCKET_MS = 0.1  # followers_child.BUCKET_NS
SAMPLED_FOLLOWERS = 40  # followers (in all) whose every arrival is kept: latency after the acknowledgement


@dataclasses.dataclass(frozen=True)
class Options:
    followers: int
    segments: int
    rate: float
    seconds: float
    processes: int
    line_bytes: int
    durability: str
    clients: str  # "trio": a trio task per follower; "threads": a thread per follower (TierClient.follow)
    via: str  # "follow": the daemon's follow socket; "api": its API socket (hypercorn), as over TCP

    @property
    def appends_per_segment(self) -> int:
        return max(1, round(self.rate * self.seconds))


@dataclasses.dataclass(frozen=True)
class Phase:
    """One source (tierfs or the reference) under the same load."""

    label: str
    followers: int
    complete: int
    lines_expected: int
    lines: int
    pieces: int  # deliveries (a piece carries the lines that became durable meanwhile)
    disorder: int
    errors: dict[str, int]
    ready_s: float
    not_ready: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    after_ack_p50_ms: float  # from the append's acknowledgement (durable) to the follower
    after_ack_p99_ms: float
    append_seconds: float
    appends: int
    append_p50_ms: float
    append_p99_ms: float
    server_cpu_s: float
    clients_cpu_s: float
    machine_busy_cores: float  # all CPUs' busy time over the phase, in cores (anything running)
    others_busy_cores: float  # of which not this benchmark (other tenants of the machine)
    server_rss_idle_bytes: int
    server_rss_bytes: int
    server_peak_rss_bytes: int

    @property
    def server_cpu_per_s(self) -> float:
        return self.server_cpu_s / self.append_seconds

    @property
    def server_us_per_line(self) -> float:
        return self.server_cpu_s / max(1, self.lines) * 1e6

    @property
    def server_us_per_piece(self) -> float:
        return self.server_cpu_s / max(1, self.pieces) * 1e6

    @property
    def rss_per_follower_bytes(self) -> float:
        return (self.server_rss_bytes - self.server_rss_idle_bytes) / self.followers


@dataclasses.dataclass(frozen=True)
class Results:
    opts: Options
    reference: Phase
    tierfs: Phase


# ------------------------------------------------------------------ processes
def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(value) for value in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def process_rss_bytes(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of a process (/proc/<pid>/status)."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def line_of(seq: int, line_bytes: int) -> bytes:
    head = b"%d %d " % (seq, time.monotonic_ns())
    return head + b"x" * max(0, line_bytes - len(head) - 1) + b"\n"


def start_children(opts: Options, log_dir: Path, label: str) -> list[JsonLineChild]:
    return [JsonLineChild(CHILD_MODULE, "--follower", log_dir / f"{label}-followers-{index}.log")
            for index in range(opts.processes)]


def send(child: JsonLineChild, message: dict[str, Any]) -> None:
    assert child.process.stdin is not None
    child.process.stdin.write(json.dumps(message) + "\n")
    child.process.stdin.flush()


def percentile_ms(histogram: Counter[int], fraction: float) -> float:
    """Upper edge of the histogram bucket holding the nearest-rank percentile."""
    total = sum(histogram.values())
    if not total:
        return math.nan
    rank, seen = max(1, math.ceil(fraction * total)), 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return (bucket + 1) * BUCKET_MS
    return math.nan


# ------------------------------------------------------------------ a phase
Appender = Callable[[int, bytes], None]  # (segment index, line): one append


def run_phase(label: str, opts: Options, address: str, segment_names: list[str], server_pid: int,
              appender_for: Callable[[int], tuple[Appender, Callable[[], None]]], log_dir: Path,
              log: TextIO) -> Phase:
    """The load against one server: children follow, appenders append, all checked."""
    idle_rss, _ = process_rss_bytes(server_pid)
    assignment = [index % opts.segments for index in range(opts.followers)]
    with contextlib.ExitStack() as stack:
        children = start_children(opts, log_dir, label)
        for child in children:
            stack.callback(child.close)
        print(f"{label}: {opts.followers} followers connecting from {opts.processes} processes ...",
              file=log, flush=True)
        appenders = [appender_for(index) for index in range(opts.segments)]
        for _, close in appenders:
            stack.callback(close)
        for index, child in enumerate(children):
            send(child, {"source": label, "address": address, "segments": segment_names,
                         "followers": assignment[index::opts.processes], "ready_timeout_s": READY_TIMEOUT_S,
                         "sample_every": max(1, opts.followers // SAMPLED_FOLLOWERS), "clients": opts.clients,
                         "via": opts.via})
        started = time.monotonic()
        for index, (append, _) in enumerate(appenders):
            append(index, line_of(0, opts.line_bytes))
        readies = [child.answer() for child in children]
        ready_s = time.monotonic() - started
        not_ready = opts.followers - sum(r["ready"] for r in readies)
        print(f"{label}: ready in {ready_s:.1f} s ({not_ready} not ready); appending for {opts.seconds:g} s ...",
              file=log, flush=True)
        pids = [server_pid, os.getpid()] + [child.process.pid for child in children]
        cpu_before, busy_before = [process_cpu_s(pid) for pid in pids], machine_busy_s()
        append_latencies_s, acked_ns, append_seconds = append_lines(opts, appenders)
        cpu_after, busy_after = [process_cpu_s(pid) for pid in pids], machine_busy_s()
        ours_s = sum(cpu_after) - sum(cpu_before)
        rss, peak_rss = process_rss_bytes(server_pid)
        for child in children:
            send(child, {"last_seq": opts.appends_per_segment, "deadline_s": DRAIN_TIMEOUT_S})
        finals = [child.answer() for child in children]
    histogram: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    after_ack_ms: list[float] = []
    for final in finals:
        histogram.update({int(bucket): count for bucket, count in final["histogram"].items()})
        errors.update(final["errors"])
        after_ack_ms += [(arrived_ns - acked_ns[segment][seq - 1]) / 1e6 for segment, seq, arrived_ns in final["samples"]]
    after_ack_ms.sort()
    ordered = sorted(append_latencies_s)
    return Phase(
        label=label, followers=opts.followers, complete=sum(f["complete"] for f in finals),
        lines_expected=opts.followers * (opts.appends_per_segment + 1), lines=sum(f["lines"] for f in finals),
        pieces=sum(f["pieces"] for f in finals),
        disorder=sum(f["disorder"] for f in finals), errors=dict(errors), ready_s=ready_s, not_ready=not_ready,
        p50_ms=percentile_ms(histogram, 0.50), p99_ms=percentile_ms(histogram, 0.99),
        max_ms=max(histogram, default=-1) * BUCKET_MS + BUCKET_MS if histogram else math.nan,
        after_ack_p50_ms=percentile(after_ack_ms, 0.50), after_ack_p99_ms=percentile(after_ack_ms, 0.99),
        append_seconds=append_seconds, appends=len(ordered),
        append_p50_ms=ordered[len(ordered) // 2] * 1e3, append_p99_ms=ordered[int(len(ordered) * 0.99)] * 1e3,
        server_cpu_s=cpu_after[0] - cpu_before[0], clients_cpu_s=sum(cpu_after[2:]) - sum(cpu_before[2:]),
        machine_busy_cores=(busy_after - busy_before) / append_seconds,
        others_busy_cores=max(0.0, busy_after - busy_before - ours_s) / append_seconds,
        server_rss_idle_bytes=idle_rss, server_rss_bytes=rss, server_peak_rss_bytes=peak_rss,
    )


def append_lines(opts: Options, appenders: list[tuple[Appender, Callable[[], None]]]
                 ) -> tuple[list[float], list[list[int]], float]:
    """Every appender appends lines 1..N at ``rate`` per second (late ones go at once):
    the append latencies, the time each was acknowledged ([segment][seq - 1], monotonic
    ns) and the seconds it took."""
    latencies: list[list[float]] = [[] for _ in appenders]
    acked_ns: list[list[int]] = [[] for _ in appenders]
    started = time.monotonic()

    def paced(index: int) -> None:
        append, _ = appenders[index]
        for seq in range(1, opts.appends_per_segment + 1):
            delay = started + seq / opts.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            before = time.monotonic_ns()
            append(index, line_of(seq, opts.line_bytes))
            acked_ns[index].append(time.monotonic_ns())
            latencies[index].append((acked_ns[index][-1] - before) / 1e9)

    threads = [threading.Thread(target=paced, args=(index,)) for index in range(len(appenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [value for values in latencies for value in values], acked_ns, time.monotonic() - started


# ------------------------------------------------------------------ the servers
@contextlib.contextmanager
def reference_server(directory: Path) -> Iterator[tuple[str, int]]:
    path = str(directory / "fanout.sock")
    with open(directory / "fanout.log", "wb") as err:
        proc = subprocess.Popen(child_command("benchmarks.fanout_reference", path), stdout=subprocess.PIPE,
                                stderr=err, env=child_environment())
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fan-out reference did not start: {(directory / 'fanout.log').read_text()}")
        yield path, proc.pid
    finally:
        proc.kill()
        proc.wait()


def reference_appender(path: str) -> Callable[[int], tuple[Appender, Callable[[], None]]]:
    def appender_for(index: int) -> tuple[Appender, Callable[[], None]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(b"A %d\n" % index)

        def append(_index: int, line: bytes) -> None:
            sock.sendall(line)
            if sock.recv(1) != b"+":  # acknowledged, as an append is
                raise RuntimeError("the fan-out reference closed an appender's connection")
        return append, sock.close
    return appender_for


def tierfs_appender(url: str, names: list[str]) -> Callable[[int], tuple[Appender, Callable[[], None]]]:
    from tierfs.remote.client import TierClient

    def appender_for(index: int) -> tuple[Appender, Callable[[], None]]:
        client = TierClient(url)

        def append(segment: int, line: bytes) -> None:
            client.append(names[segment], line)
        return append, client.close
    return appender_for


def measure(directory: Path, opts: Options, log: TextIO) -> Results:
    from tierfs.contracts.datadir import follow_socket_path
    from tierfs.testing.harness import start_daemon

    with reference_server(directory) as (path, pid):
        reference = run_phase("reference", opts, path, [str(i) for i in range(opts.segments)], pid,
                              reference_appender(path), directory, log)
    daemon = start_daemon(directory / "daemon", drop_tierfs_env=True, log_path=directory / "daemon.log",
                          verbose=False)
    try:
        if opts.via == "api":  # TierClient.follow streams through the API when there is no follow socket
            follow_socket_path(daemon.data_dir).unlink()
        client = daemon.client()
        names = [f"followed/{index}.log" for index in range(opts.segments)]
        for name in names:
            client.create(name, durability=opts.durability, parents=True)
        client.close()
        tierfs = run_phase("tierfs", opts, daemon.url, names, daemon.pid, tierfs_appender(daemon.url, names),
                           directory, log)
    finally:
        daemon.stop(timeout_s=STOP_TIMEOUT_S)
    return Results(opts, reference, tierfs)


# ------------------------------------------------------------------ report
def evaluate(r: Results) -> list[Check]:
    t = r.tierfs
    return [
        Check("followers with every line, once, in order", t.complete, t.followers, True),
        Check("followers that failed (errors)", sum(t.errors.values()) + t.not_ready, 0, False),
        Check("append -> follower latency p99", t.p99_ms, TARGET_P99_MS, False, "ms"),
    ]


def phase_rows(p: Phase) -> list[str]:
    errors = ", ".join(f"{count} x {message}" for message, count in p.errors.items()) or "none"
    return [
        f"{p.label}:",
        f"  followers complete {p.complete}/{p.followers}; lines {p.lines}/{p.lines_expected} in {p.pieces} "
        f"deliveries ({p.lines / max(1, p.pieces):.2f} lines each); out of order {p.disorder}; errors: {errors}; "
        f"not ready {p.not_ready}",
        f"  all connected with line 0 after {p.ready_s:.2f} s",
        f"  latency append -> follower: p50 {p.p50_ms:.1f} ms, p99 {p.p99_ms:.1f} ms, max {p.max_ms:.1f} ms; "
        f"after the acknowledgement ({SAMPLED_FOLLOWERS} followers): p50 {p.after_ack_p50_ms:.1f} ms, "
        f"p99 {p.after_ack_p99_ms:.1f} ms",
        f"  appends: {p.appends} in {p.append_seconds:.1f} s ({p.appends / p.append_seconds:.0f}/s), "
        f"round trip p50 {p.append_p50_ms:.2f} ms, p99 {p.append_p99_ms:.2f} ms",
        f"  server CPU {p.server_cpu_s:.1f} s ({p.server_cpu_per_s * 100:.0f}% of a core; per follower "
        f"{p.server_cpu_per_s / p.followers * 1e6:.0f} us/s; {p.server_us_per_line:.1f} us per line, "
        f"{p.server_us_per_piece:.1f} us per delivery); "
        f"client processes CPU {p.clients_cpu_s:.1f} s ({p.clients_cpu_s / p.append_seconds * 100:.0f}% of a core)",
        f"  the machine's CPUs busy {p.machine_busy_cores:.2f} cores, of which {p.others_busy_cores:.2f} "
        f"not this benchmark's",
        f"  server RSS {p.server_rss_bytes / 2**20:.1f} MiB (idle {p.server_rss_idle_bytes / 2**20:.1f} MiB, "
        f"peak {p.server_peak_rss_bytes / 2**20:.1f} MiB): {p.rss_per_follower_bytes / 1024:.1f} KiB per follower",
    ]


def print_report(machine: dict[str, Any], r: Results, checks: list[Check], out: TextIO) -> None:
    o, t, ref = r.opts, r.tierfs, r.reference
    print_sections([
        [f"machine: {machine['cpus']} CPUs, {machine['platform']}, Python {machine['python']}",
         f"{o.followers} followers ({o.clients}, via the {o.via} socket) in {o.processes} processes, {o.segments} segments ({o.durability}) "
        f"appended {o.rate:g}/s each for {o.seconds:g} s, {o.line_bytes}-byte lines"],
        phase_rows(ref),
        phase_rows(t),
        [f"ratios tierfs / reference: p50 {t.p50_ms / ref.p50_ms:.1f}x, p99 {t.p99_ms / ref.p99_ms:.1f}x, "
         f"server CPU {t.server_cpu_s / max(ref.server_cpu_s, 1e-9):.1f}x, "
         f"client CPU {t.clients_cpu_s / max(ref.clients_cpu_s, 1e-9):.1f}x"],
        format_checks(checks, 44),
    ], out)


def to_json(machine: dict[str, Any], r: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "options": dataclasses.asdict(r.opts),
            "reference": dataclasses.asdict(r.reference), "tierfs": dataclasses.asdict(r.tierfs),
            "checks": checks_json(checks)}


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
    opts = Options(args.followers, args.segments, args.rate, args.seconds, args.processes, args.line_bytes,
                   args.durability, args.clients, args.via)
    if min(opts.followers, opts.segments, opts.processes) < 1 or opts.rate <= 0 or opts.seconds <= 0:
        print("--followers, --segments, --processes, --rate and --seconds must be > 0", file=sys.stderr)
        return 2
    log = sys.stderr
    return run_in_scratch("followers", args.dir, args.json, lambda d: measure(d, opts, log), evaluate,
                          print_report, to_json, errors=(RuntimeError, OSError))
