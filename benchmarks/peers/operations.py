"""The operations ``benchmarks peers`` runs through every mount, each timed the same way
whatever the system behind the mount point: 4 KiB ``pread``s checked against the payload
(``distinct_blocks``: each in a different 1 MiB block, so none is served by a block an
earlier one fetched); ``count`` x (write 4 KiB + fsync) on one O_APPEND descriptor, then
how many bytes S3 holds (what the fsync promised); ``open(O_CREAT|O_EXCL)``/write/close
of small files; ``ls -l``; ``tail -f -s 0.01`` of a file, from each line's ``echo >>``
until tail prints it. ``settle`` waits until a system has put what it owes S3 (no
PUT/POST/DELETE through the proxy for 2 s), ``wait_idle`` until its traffic has died
down, and ``watchdog`` kills a system's process when an operation takes far too long.

Invariant: every operation returns its figure or raises ``OperationError`` / ``OSError``
with the reason; nothing is retried or skipped silently.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.harness.figures import MiB
from benchmarks.harness.line_timing import time_lines
from benchmarks.peers.proxy import Traffic, total, traffic_difference

READ_BYTES = APPEND_BYTES = 4096
BLOCK_BYTES = MiB  # tierfs's cache block; rclone and s3fs fetch at least this much per miss
SMALL_FILE_BYTES = 1024  # "small": far below any system's block or part size
QUIET_S, SETTLE_POLL_S, SETTLE_TIMEOUT_S = 2.0, 0.2, 300.0  # settle: no upload for QUIET_S, nothing pending
IDLE_WINDOW_S, IDLE_BYTES = 1.0, 64 << 10  # tierfs's owner checks and such: a few small requests a second
TAIL_GAP_S = (0.05, 0.10)  # pause between lines, random so tail's 10 ms poll phase varies
HANG_S = 1800.0  # an operation still running after this long is a hang (the slowest takes minutes)


class OperationError(RuntimeError):
    """The operation could not be done or gave a wrong result (the message says why)."""


@contextmanager
def watchdog(on_hang: Callable[[], None]) -> Iterator[list[bool]]:
    """While the block runs: once it has run ``HANG_S``, call ``on_hang`` (it kills the
    system's process, so a system call blocked on its mount returns with an error) and
    set the yielded flag."""
    fired, stop = [False], threading.Event()

    def watch() -> None:
        if not stop.wait(HANG_S):
            fired[0] = True
            on_hang()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        stop.set()
        thread.join()


def random_reads(path: Path, payload: bytes, count: int, seed: int, distinct_blocks: bool) -> list[float]:
    """Seconds of each 4 KiB pread (see the module docstring)."""
    rng, blocks = random.Random(seed), len(payload) // BLOCK_BYTES
    if distinct_blocks and blocks:
        chosen = rng.sample(range(blocks), min(count, blocks))
        offsets = [b * BLOCK_BYTES + rng.randrange(BLOCK_BYTES // READ_BYTES) * READ_BYTES for b in chosen]
    else:
        offsets = [rng.randrange(len(payload) // READ_BYTES) * READ_BYTES for _ in range(count)]
    latencies = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in offsets:
            start = time.perf_counter()
            data = os.pread(fd, READ_BYTES, offset)
            latencies.append(time.perf_counter() - start)
            if data != payload[offset : offset + READ_BYTES]:
                raise OperationError(f"pread of 4 KiB at {offset} returned wrong bytes")
    finally:
        os.close(fd)
    return latencies


@dataclasses.dataclass(frozen=True)
class AppendRun:
    appended: int
    seconds: float
    in_s3_at_last_fsync: int  # bytes S3 held right after the last fsync

    @property
    def rate(self) -> float:
        return self.appended / self.seconds if self.seconds > 0 else float("nan")


def appends(path: Path, count: int, bytes_in_s3: Callable[[], int]) -> AppendRun:
    """``count`` x (write 4 KiB + fsync) on one O_APPEND descriptor (see the docstring)."""
    block = random.Random(count).randbytes(APPEND_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = time.perf_counter()
        for done in range(count):
            if os.write(fd, block) != APPEND_BYTES:
                raise OperationError(f"a short write after {done} appends")
            os.fsync(fd)
        seconds = time.perf_counter() - start
        return AppendRun(count, seconds, bytes_in_s3())
    finally:
        os.close(fd)


def settle(snapshot: Callable[[], Traffic], min_s: float, condition: Callable[[], bool]) -> float:
    """Wait at least ``min_s``, then until ``condition()`` holds and no PUT, POST or
    DELETE has gone through the proxy for ``QUIET_S``. Returns the seconds until
    ``condition()`` first held; ``OperationError`` after ``SETTLE_TIMEOUT_S``."""
    start = time.monotonic()
    time.sleep(min_s)
    last, quiet_since, held_after_s = snapshot(), time.monotonic(), None
    while True:
        if held_after_s is None and condition():
            held_after_s = time.monotonic() - start
        if held_after_s is not None and time.monotonic() - quiet_since >= QUIET_S:
            return held_after_s
        if time.monotonic() - start > SETTLE_TIMEOUT_S:
            raise OperationError(f"still uploading (or incomplete in S3) after {SETTLE_TIMEOUT_S:g} s")
        time.sleep(SETTLE_POLL_S)
        now = snapshot()
        if {"PUT", "POST", "DELETE"} & set(traffic_difference(now, last)):
            quiet_since = time.monotonic()
        last = now


def wait_idle(snapshot: Callable[[], Traffic]) -> bool:
    """Wait until less than ``IDLE_BYTES`` go through the proxy in ``IDLE_WINDOW_S``
    (a system may still be fetching or uploading after its operation returned: that
    traffic belongs to the operation). False if it never got that quiet."""
    deadline, last = time.monotonic() + SETTLE_TIMEOUT_S, total(snapshot())
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW_S)
        now = total(snapshot())
        if (now.bytes_up - last.bytes_up) + (now.bytes_down - last.bytes_down) < IDLE_BYTES:
            return True
        last = now
    return False


def create_small_files(directory: Path, count: int) -> float:
    """Seconds to create ``count`` files of ``SMALL_FILE_BYTES`` in ``directory``."""
    content = b"s" * SMALL_FILE_BYTES
    start = time.perf_counter()
    for created in range(count):
        fd = os.open(directory / f"f{created:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if os.write(fd, content) != SMALL_FILE_BYTES:
                raise OperationError(f"a short write to file {created + 1}")
        finally:
            os.close(fd)
    return time.perf_counter() - start


def list_long(directory: Path, expected: int) -> float:
    """Seconds of ``ls -l DIR``; fails unless it lists ``expected`` entries."""
    start = time.perf_counter()
    done = subprocess.run(["ls", "-l", str(directory)], capture_output=True, text=True, timeout=HANG_S)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise OperationError(f"ls -l failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    entries = sum(1 for line in done.stdout.splitlines() if not line.startswith("total "))
    if entries != expected:
        raise OperationError(f"ls -l listed {entries} of {expected} files")
    return seconds


def tail_latencies(path: Path, lines: int, seed: int) -> list[float]:
    """Seconds from each ``echo >> FILE`` until ``tail -f -s 0.01`` printed the line."""
    def append(line: bytes) -> None:
        with open(path, "ab") as writer:
            writer.write(line)

    append(b"")
    gaps = itertools.accumulate(random.Random(seed).uniform(*TAIL_GAP_S) for _ in range(lines))
    timed = time_lines(["tail", "-f", "-s", "0.01", "-n", "0", str(path)], append, list(gaps))
    if len(timed.seen) < lines:
        raise OperationError(f"tail -f did not show {lines - len(timed.seen)} of {lines} appended lines")
    return [timed.seen[i] - timed.sent[i] for i in range(lines)]
