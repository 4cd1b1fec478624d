"""Tail latency (issue 20, item 4): how long a line takes from its append to a follower's
screen. ``--lines`` (1,000) lines are appended at ``--rate`` (100 a second), one per PD
append through the daemon's API, to one segment of a tierfs mount; a thread reads each
follower's stdout and times every line as it arrives. Followers, one after the other:

- (t) ``tierfs tail -f -n 0`` (what the README shows): the daemon's streamed follow;
- (g) GNU ``tail -f -s S -n 0`` (``--gnu-sleep``, 0.01 s) of the segment on the mount:
  GNU tail polls a FUSE file every ``-s``;
- (c) the ceiling: GNU ``tail -f -s S -n 0`` of a plain file fed one ``write(2)`` per
  line (inotify wakes it; no daemon, no durability).

Per follower: the latency from the append's acknowledgement to the line (a line may
arrive before its acknowledgement: both leave the daemon at once) and from just before
the append was sent, p50/p99/max; the follower's CPU; the append's own round trip (a
PD append returns after fdatasync and no follower may see a line before that, so it
bounds the latency from the send). Target: (t) p99 from the acknowledgement <= 20 ms.
Before each phase warm-up lines are appended every 50 ms until the follower prints one.
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

from benchmarks.harness import procfs
from benchmarks.harness.figures import Check, Latency
from benchmarks.harness.scenario import (
    Report,
    UsageError,
    add_scratch_arguments,
    run_scenario,
    table,
)
from tierfs.testing.harness import HarnessError, Mount, process_environment

HELP = "append-to-screen latency of tierfs tail -f next to GNU tail -f on the mount and on a local file"
TARGET_P99_MS = 20.0
SEGMENT = "bench/tail.log"
WARMUP_INTERVAL_S = 0.05  # a warm-up line this often until the follower prints one
START_TIMEOUT_S = 30.0  # a follower prints its first line within ~1 s; 30 s rides out a loaded host
DRAIN_TIMEOUT_S = 10.0  # after the last append, every line arrives within this (or is missing)


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
        yield lambda: procfs.cpu_s(proc.pid)
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


def report(r: Results) -> Report:
    def ratio(value: float, reference: float) -> str:
        """``n/a`` when the reference is no positive time (every line missing, or lines
        that arrived before their acknowledgement)."""
        return f"{value / reference:.2f}x" if reference > 0 else "n/a"

    rows = [[p.label, p.from_ack.p50_us / 1e3, p.from_ack.p99_us / 1e3, p.from_ack.max_us / 1e3, p.from_send.p50_us / 1e3,
             p.from_send.p99_us / 1e3, p.missing, f"{p.cpu_s:.2f}", p.append.p50_us / 1e3, p.append.p99_us / 1e3]
            for p in r.phases.values()]
    t = r.phases["t"]
    ratios = [f"(t)/({key}) {name}: sent->screen p50 {ratio(t.from_send.p50_us, o.from_send.p50_us)}, p99 "
              f"{ratio(t.from_send.p99_us, o.from_send.p99_us)}; ack->screen p99 {ratio(t.from_ack.p99_us, o.from_ack.p99_us)}"
              for key, name in (("g", "GNU tail on the mount"), ("c", "GNU tail on a local file (ceiling)"))
              for o in [r.phases[key]]]
    checks = [Check("(t) tierfs tail -f p99, ack -> screen", t.from_ack.p99_us / 1000, TARGET_P99_MS, False, "ms"),
              Check("(t) lines missing", t.missing, 0, False)]
    header = ["follower (ms)", "ack->screen p50", "p99", "max", "sent->screen p50", "p99", "missing", "CPU s",
              "append p50", "p99"]
    return Report(f"tail latency: {r.lines} lines at {r.rate:g}/s per follower, PD appends through the API",
                  [table(header, rows, 2), ratios], checks, {"results": r})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lines", type=int, default=1000, help="lines per follower (default 1000)")
    parser.add_argument("--rate", type=float, default=100.0, help="appends per second (default 100)")
    parser.add_argument("--gnu-sleep", type=float, default=0.01, help="GNU tail's -s (default 0.01)")
    add_scratch_arguments(parser, "the data dir, the mount point and the plain file")


def run(args: argparse.Namespace) -> int:
    def measured(directory: Path) -> Report:
        if args.lines < 1 or args.rate <= 0 or args.gnu_sleep <= 0:
            raise UsageError("--lines, --rate and --gnu-sleep must be > 0")
        return report(measure(directory, args.lines, args.rate, args.gnu_sleep))

    return run_scenario("tail", args, measured, errors=(HarnessError, OSError))
