"""Tail latency (issue 20, item 4): how long a line takes from its append to a follower's
screen. ``--lines`` (1,000) lines are appended at 100 a second, one PD append each through
the daemon's API, to one segment of a tierfs mount, and timed as each follower prints
them (``harness.line_timing``, after a warm-up). Followers, one after the other: (t)
``tierfs tail -f -n 0`` (the daemon's streamed follow); (g) GNU ``tail -f -s 0.01 -n 0``
of the segment on the mount (it polls a FUSE file every ``-s``); (c) the ceiling, GNU
``tail -f -s 0.01 -n 0`` of a plain file fed one ``write(2)`` per line (inotify; no
daemon, no durability). Per follower: the latency from the append's acknowledgement to
the line (a line may arrive first: both leave the daemon at once) and from just before
the append was sent; the follower's CPU; the append's round trip (a PD append returns
after fdatasync and no follower may see a line before that). Target: (t) p99 from the
acknowledgement <= 20 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.figures import Check, Latency
from benchmarks.harness.line_timing import time_lines
from benchmarks.harness.mounts import mounted
from benchmarks.harness.scenario import Report, positive, table
from tierfs.testing.harness import process_environment

HELP = "append-to-screen latency of tierfs tail -f next to GNU tail -f on the mount and on a local file"
TARGET_P99_MS = 20.0
SEGMENT = "bench/tail.log"
RATE_PER_S = 100.0
GNU_TAIL = ["tail", "-f", "-s", "0.01", "-n", "0"]


@dataclasses.dataclass(frozen=True)
class Phase:
    label: str
    from_ack: Latency
    from_send: Latency
    append: Latency  # send -> acknowledgement: what a line waits for before any follower may see it
    missing: int  # lines never printed
    cpu_s: float  # the follower process's CPU


def follow(label: str, command: list[str], append: Callable[[bytes], object], lines: int) -> Phase:
    timed = time_lines(command, append, [i / RATE_PER_S for i in range(lines)], process_environment(drop_tierfs=True))
    got = sorted(timed.seen)
    return Phase(label, Latency.of([timed.seen[i] - timed.acked[i] for i in got]),
                 Latency.of([timed.seen[i] - timed.sent[i] for i in got]),
                 Latency.of([ack - sent for sent, ack in zip(timed.sent, timed.acked, strict=True)]),
                 lines - len(got), timed.cpu_s)


def measure(directory: Path, args: argparse.Namespace) -> Report:
    data_dir, plain = directory / "data", directory / "plain.log"
    with mounted(data_dir, directory / "mnt") as mount:
        client = mount.client()
        client.create(SEGMENT, durability="pd", parents=True)
        tierfs_tail = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "tail", "-f", "-n", "0", SEGMENT]
        phases = [follow("(t) tierfs tail -f", tierfs_tail, lambda line: client.append(SEGMENT, line), args.lines),
                  follow("(g) GNU tail -f -s 0.01, mount", [*GNU_TAIL, str(mount.path(SEGMENT))],
                         lambda line: client.append(SEGMENT, line), args.lines)]
        client.close()
    fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        phases.append(follow("(c) GNU tail -f -s 0.01, local file", [*GNU_TAIL, str(plain)],
                             lambda line: os.write(fd, line), args.lines))
    finally:
        os.close(fd)
    return report(phases, args.lines)


def report(phases: list[Phase], lines: int) -> Report:
    def ratio(value: float, reference: float) -> str:  # n/a: lines all missing, or before their ack
        return f"{value / reference:.2f}x" if reference > 0 else "n/a"

    rows = [[p.label, p.from_ack.p50_us / 1e3, p.from_ack.p99_us / 1e3, p.from_ack.max_us / 1e3, p.from_send.p50_us / 1e3,
             p.from_send.p99_us / 1e3, p.missing, f"{p.cpu_s:.2f}", p.append.p50_us / 1e3, p.append.p99_us / 1e3]
            for p in phases]
    t = phases[0]
    ratios = [f"(t)/{o.label[:3]} {name}: sent->screen p50 {ratio(t.from_send.p50_us, o.from_send.p50_us)}, p99 "
              f"{ratio(t.from_send.p99_us, o.from_send.p99_us)}; ack->screen p99 {ratio(t.from_ack.p99_us, o.from_ack.p99_us)}"
              for o, name in zip(phases[1:], ("GNU tail on the mount", "GNU tail on a local file (ceiling)"), strict=True)]
    checks = [Check("(t) tierfs tail -f p99, ack -> screen", t.from_ack.p99_us / 1000, TARGET_P99_MS, False, "ms"),
              Check("(t) lines missing", t.missing, 0, False)]
    header = ["follower (ms)", "ack->screen p50", "p99", "max", "sent->screen p50", "p99", "missing", "CPU s",
              "append p50", "p99"]
    return Report(f"tail latency: {lines} lines at {RATE_PER_S:g}/s per follower, PD appends through the API",
                  [table(header, rows, 2), ratios], checks, {"phases": phases})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lines", type=positive, default=1000, help="lines per follower (default 1000)")
