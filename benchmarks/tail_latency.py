"""Tail latency (issue 20, item 4): ``python -m benchmarks tail``.

How long a line takes from its append to a follower's screen. ``--lines`` lines
(1,000) are appended at a steady ``--rate`` (100 a second), one line per append, PD,
through the daemon's API, to one segment of a tierfs mount (the daemon serves the
mount and the API). Each line carries its phase and sequence number; a thread reads
the follower's stdout and times every line as it arrives. Followers, each measured on
its own, one after the other, in the same run:

- (t) ``tierfs tail -f -n 0`` (a subprocess, what the README shows): the daemon's
  streamed follow, woken by the growth notification;
- (g) GNU ``tail -f -s S -n 0`` (``--gnu-sleep``, 0.01 s) of the same segment through
  the tierfs mount: GNU tail treats every FUSE file as remote and polls each ``-s``;
- (c) the ceiling: GNU ``tail -f -s S -n 0`` of a plain file in the scratch directory,
  fed with one write(2) per line (inotify wakes tail; no daemon, no durability);
- (s) where (t)'s time goes: ``TierClient.follow`` in this process, the same stream
  without tail's process and pipe.

Per follower: latency from the append's acknowledgement (the write(2)'s return for
(c)) to the line read from the follower, and from just before the append was sent,
p50/p99/max (a line may arrive before its acknowledgement does: both leave the daemon
at once, so the p50 from the acknowledgement is near zero or below); the follower's
CPU time (its start included); and the append itself, send to acknowledgement (a PD
append returns after fdatasync, and no follower may see a line before that, so it
bounds the latency from the send). Printed: the ratios (t)/(g) and (t)/(c) of p50 and
p99 from the send, and of p99 from the acknowledgement; the target: (t) p99 from the
acknowledgement <= 20 ms. Before each phase, warm-up lines are appended every 50 ms
until the follower prints one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from benchmarks.common import (
    Check,
    Latency,
    add_scratch_arguments,
    checks_json,
    format_checks,
    run_in_scratch,
)
from tierfs.contracts.info import SegmentInfo
from tierfs.testing.harness import HarnessError, Mount, process_environment

HELP = "append-to-screen latency of tierfs tail -f next to GNU tail -f on the mount and on a local file"
TARGET_P99_MS = 20.0
SEGMENT = "bench/tail.log"
WARMUP_INTERVAL_S = 0.05  # a warm-up line this often until the follower prints one
START_TIMEOUT_S = 30.0  # a follower prints its first line within ~1 s; 30 s rides out a loaded host
DRAIN_TIMEOUT_S = 10.0  # after the last append, every line arrives within this (or is missing)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Phase:
    label: str
    from_ack: Latency
    from_send: Latency
    append: Latency  # send -> acknowledgement: what a line waits for before any follower may see it
    missing: int  # lines never printed
    cpu_s: float  # the follower process's CPU (this process's for (s): not counted)


@dataclasses.dataclass
class Results:
    lines: int
    rate: float
    gnu_sleep_s: float
    phases: dict[str, Phase]


class LineTimes:
    """When each line of one phase was sent, acknowledged and seen by the follower."""

    def __init__(self, phase: str, lines: int) -> None:
        self.prefix = f"{phase}:".encode()
        self.sent = [0.0] * lines
        self.acked = [0.0] * lines
        self.seen: dict[int, float] = {}
        self.warm = threading.Event()
        self._buffer = b""

    def take(self, data: bytes, now: float) -> None:
        """Bytes the follower printed, read at ``now``."""
        *complete, self._buffer = (self._buffer + data).split(b"\n")
        for line in complete:
            if line.startswith(self.prefix):
                self.seen.setdefault(int(line[len(self.prefix):]), now)
            elif line.startswith(b"warm"):
                self.warm.set()

    def phase(self, label: str, cpu_s: float) -> Phase:
        got = [i for i in range(len(self.sent)) if i in self.seen]
        return Phase(label, Latency.of([self.seen[i] - self.acked[i] for i in got]),
                     Latency.of([self.seen[i] - self.sent[i] for i in got]),
                     Latency.of([ack - sent for sent, ack in zip(self.sent, self.acked, strict=True)]),
                     len(self.sent) - len(got), cpu_s)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _read_pipe(fd: int, times: LineTimes) -> None:
    while data := os.read(fd, 65536):
        times.take(data, time.monotonic())


@contextlib.contextmanager
def _follower_process(command: list[str], times: LineTimes) -> Iterator[Callable[[], float]]:
    """A follower subprocess whose stdout feeds ``times``; yields its CPU time reader."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=process_environment(drop_tierfs=True))
    assert proc.stdout is not None
    reader = threading.Thread(target=_read_pipe, args=(proc.stdout.fileno(), times), daemon=True)
    reader.start()
    try:
        yield lambda: _cpu_s(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=10)
        proc.stdout.close()


def _run_lines(times: LineTimes, append: Callable[[bytes], None], lines: int, rate: float) -> None:
    """Warm up, then append ``lines`` lines at ``rate``; wait for the last to arrive."""
    deadline, count = time.monotonic() + START_TIMEOUT_S, 0
    while not times.warm.wait(WARMUP_INTERVAL_S):
        if time.monotonic() > deadline:
            raise HarnessError(f"the follower printed nothing within {START_TIMEOUT_S:g} s")
        append(b"warm %d\n" % count)
        count += 1
    start = time.monotonic() + 0.1
    for i in range(lines):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        times.sent[i] = time.monotonic()
        append(times.prefix + b"%d\n" % i)
        times.acked[i] = time.monotonic()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(times.seen) < lines and time.monotonic() < deadline:
        time.sleep(0.01)


def _measure_client_follow(mount: Mount, append: Callable[[bytes], None], lines: int, rate: float) -> Phase:
    """(s): the daemon's streamed follow read in this process, from the current end."""
    times = LineTimes("s", lines)
    follower = mount.client()
    info = follower.stat(SEGMENT)
    assert isinstance(info, SegmentInfo)

    def follow() -> None:
        with contextlib.suppress(Exception):  # the stream ends with the mount's daemon
            for piece in follower.follow(SEGMENT, info.length):
                times.take(piece, time.monotonic())
                if len(times.seen) == lines:
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        _run_lines(times, append, lines, rate)
    finally:
        follower.close()
    return times.phase("(s) TierClient.follow, this process", 0.0)


def measure(directory: Path, lines: int, rate: float, gnu_sleep_s: float) -> Results:
    phases: dict[str, Phase] = {}
    data_dir, mountpoint = directory / "data", directory / "mnt"
    mount = Mount(data_dir, mountpoint, drop_tierfs_env=True, log_path=directory / "mount.log", verbose=False)
    try:
        client = mount.client()
        client.create(SEGMENT, durability="pd", parents=True)

        def append(line: bytes) -> None:
            client.append(SEGMENT, line)

        tierfs_tail = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "tail", "-f", "-n", "0", SEGMENT]
        gnu_tail = ["tail", "-f", "-s", f"{gnu_sleep_s:g}", "-n", "0"]
        for key, label, command in (
            ("t", "(t) tierfs tail -f", tierfs_tail),
            ("g", f"(g) GNU tail -f -s {gnu_sleep_s:g}, mount", [*gnu_tail, str(mountpoint / SEGMENT)]),
        ):
            times = LineTimes(key, lines)
            with _follower_process(command, times) as cpu_s:
                _run_lines(times, append, lines, rate)
                phases[key] = times.phase(label, cpu_s())
        phases["s"] = _measure_client_follow(mount, append, lines, rate)
        client.close()
    finally:
        mount.unmount()
    plain = directory / "plain.log"
    fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        times = LineTimes("c", lines)
        with _follower_process([*gnu_tail, str(plain)], times) as cpu_s:
            def write(line: bytes) -> None:
                os.write(fd, line)

            _run_lines(times, write, lines, rate)
            phases["c"] = times.phase(f"(c) GNU tail -f -s {gnu_sleep_s:g}, local file", cpu_s())
    finally:
        os.close(fd)
    return Results(lines, rate, gnu_sleep_s, phases)


def evaluate(r: Results) -> list[Check]:
    return [Check("(t) tierfs tail -f p99, ack -> screen", r.phases["t"].from_ack.p99_us / 1000,
                  TARGET_P99_MS, at_least=False, unit="ms"),
            Check("(t) lines missing", r.phases["t"].missing, 0, at_least=False)]


def _ratio(value: float, reference: float) -> str:
    """``value / reference`` as ``1.23x``; ``n/a`` when the reference is not a positive time
    (a phase with every line missing, or lines that arrived before their acknowledgement)."""
    return f"{value / reference:.2f}x" if reference > 0 else "n/a"


def print_report(machine: dict[str, Any], r: Results, checks: list[Check], out: TextIO) -> None:
    print(f"tail latency: {r.lines} lines at {r.rate:g}/s per follower, PD appends through the API; "
          f"{machine['cpus']} CPUs, {machine['filesystem']['fs_type']} on {machine['filesystem']['device']}", file=out)
    print(file=out)
    header = (f"{'follower':<40} {'ack->screen p50':>15} {'p99':>8} {'max':>8}   "
              f"{'sent->screen p50':>16} {'p99':>8}  {'missing':>7}  {'CPU s':>6}   {'append p50':>11} {'p99':>6}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for phase in r.phases.values():
        a, s = phase.from_ack, phase.from_send
        print(f"{phase.label:<40} {a.p50_us / 1000:>12.2f} ms {a.p99_us / 1000:>8.2f} {a.max_us / 1000:>8.2f}   "
              f"{s.p50_us / 1000:>13.2f} ms {s.p99_us / 1000:>8.2f}  {phase.missing:>7}  {phase.cpu_s:>6.2f}   "
              f"{phase.append.p50_us / 1000:>8.2f} ms {phase.append.p99_us / 1000:>6.2f}", file=out)
    print(file=out)
    t = r.phases["t"]
    for key, name in (("g", "GNU tail on the mount"), ("c", "GNU tail on a local file (ceiling)")):
        other = r.phases[key]
        print(f"(t)/({key}) {name}: sent->screen p50 {_ratio(t.from_send.p50_us, other.from_send.p50_us)}, "
              f"p99 {_ratio(t.from_send.p99_us, other.from_send.p99_us)}; "
              f"ack->screen p99 {_ratio(t.from_ack.p99_us, other.from_ack.p99_us)}", file=out)
    print(file=out)
    for line in format_checks(checks):
        print(line, file=out)


def report_json(machine: dict[str, Any], r: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "lines": r.lines, "rate": r.rate, "gnu_sleep_s": r.gnu_sleep_s,
            "phases": {key: dataclasses.asdict(phase) for key, phase in r.phases.items()},
            "checks": checks_json(checks)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lines", type=int, default=1000, help="lines per follower (default 1000)")
    parser.add_argument("--rate", type=float, default=100.0, help="appends per second (default 100)")
    parser.add_argument("--gnu-sleep", type=float, default=0.01, help="GNU tail's -s (default 0.01)")
    add_scratch_arguments(parser, "the data dir, the mount point and the plain file")


def run(args: argparse.Namespace) -> int:
    if args.lines < 1 or args.rate <= 0 or args.gnu_sleep <= 0:
        print("--lines, --rate and --gnu-sleep must be > 0", file=sys.stderr)
        return 2
    return run_in_scratch(
        "tail", args.dir, args.json,
        lambda directory: measure(directory, args.lines, args.rate, args.gnu_sleep),
        evaluate, print_report, report_json, errors=(HarnessError, OSError),
    )
