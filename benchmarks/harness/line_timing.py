"""A follower process (``tail -f`` and the like) timed line by line: lines appended
through the caller's function, each timed just before its append, after the append
returned, and when the follower printed it.

Invariants: the follower is warmed up first (a warm-up line every 50 ms until it prints
one: its start-up is no line's latency); each line carries its number, so a line counts
once, at its first arrival; the follower's process is stopped before this returns.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from benchmarks.harness import procfs

WARMUP_INTERVAL_S = 0.05
START_TIMEOUT_S = 30.0  # a follower prints its first line within ~1 s; 30 s rides out a loaded host
DRAIN_TIMEOUT_S = 30.0  # after the last append, every line arrives within this (or is missing)


@dataclasses.dataclass
class TimedLines:
    sent: list[float]  # monotonic seconds, by line
    acked: list[float]
    seen: dict[int, float]  # line -> when the follower printed it (missing lines absent)
    cpu_s: float = 0.0  # the follower's


def time_lines(command: list[str], append: Callable[[bytes], object], send_at_s: Sequence[float],
               env: Mapping[str, str] | None = None) -> TimedLines:
    """Start ``command``, warm it up, append line ``i`` ``send_at_s[i]`` after the start, wait."""
    times, warm = TimedLines([0.0] * len(send_at_s), [0.0] * len(send_at_s), {}), threading.Event()

    def read(fd: int) -> None:
        rest = b""
        while data := os.read(fd, 65536):
            now = time.monotonic()
            *complete, rest = (rest + data).split(b"\n")
            for line in complete:
                if line.startswith(b"line "):
                    times.seen.setdefault(int(line[5:]), now)
                warm.set()

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    reader = threading.Thread(target=read, args=(proc.stdout.fileno(),), daemon=True)
    reader.start()
    try:
        deadline, count = time.monotonic() + START_TIMEOUT_S, 0
        while not warm.wait(WARMUP_INTERVAL_S):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} printed nothing within {START_TIMEOUT_S:g} s")
            append(b"warm %d\n" % count)
            count += 1
        start = time.monotonic() + 0.1
        for i, at_s in enumerate(send_at_s):
            time.sleep(max(0.0, start + at_s - time.monotonic()))
            times.sent[i] = time.monotonic()
            append(b"line %d\n" % i)
            times.acked[i] = time.monotonic()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while len(times.seen) < len(send_at_s) and time.monotonic() < deadline:
            time.sleep(0.01)
        times.cpu_s = procfs.cpu_s(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=10)
        proc.stdout.close()
    return times
