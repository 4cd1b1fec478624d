"""The operations ``benchmarks peers`` runs through every mount, each timed the same way
whatever the system behind the mount point: ``dd bs=1M`` of a file; 4 KiB ``pread``s
checked against the payload (``distinct_blocks``: each in a different 1 MiB block, so
none is served by a block an earlier one fetched); ``count`` x (write 4 KiB + fsync) on
one O_APPEND descriptor, then how many bytes S3 holds (what the fsync promised);
``open(O_CREAT|O_EXCL)``/write/close of small files; ``ls -l``; ``tail -f -s 0.01`` of a
file, from each line's ``echo >>`` until tail prints it. ``settle`` waits until a system
has put what it owes S3 (no PUT/POST/DELETE through the proxy for 2 s), ``wait_idle``
until its traffic has died down, and ``watchdog`` kills a system's process when an
operation makes no progress for too long, so a hung mount ends as an error.

Invariant: every operation returns its figure or raises ``OperationError`` / ``OSError``
with the reason; nothing is retried or skipped silently, and a long operation stops at
its deadline and says so in its figure.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import select
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from benchmarks.harness.figures import MiB
from benchmarks.harness.fuse import BenchError, dd
from benchmarks.peers.proxy import Traffic, total, traffic_difference

READ_BYTES = 4096
BLOCK_BYTES = MiB  # tierfs's cache block; rclone and s3fs fetch at least this much per miss
APPEND_BYTES = 4096
SMALL_FILE_BYTES = 1024  # "small": far below any system's block or part size
QUIET_S = 2.0  # no upload for this long: the system has nothing pending
SETTLE_POLL_S = 0.2
SETTLE_TIMEOUT_S = 300.0
WRITE_METHODS = ("PUT", "POST", "DELETE")
IDLE_WINDOW_S = 1.0
IDLE_BYTES = 64 << 10  # tierfs's owner checks and such: a few small requests a second
TAIL_TIMEOUT_S = 10.0  # a line not shown by then is reported as not visible
TAIL_GAP_S = (0.05, 0.10)  # pause between lines, random so tail's 10 ms poll phase varies
LS_TIMEOUT_S = 1800.0
WATCHDOG_POLL_S = 1.0


class OperationError(RuntimeError):
    """The operation could not be done or gave a wrong result (the message says why)."""


class Progress:
    """The running operation's heartbeat: loops call ``beat`` once per step, and
    ``watchdog`` calls its ``on_hang`` when no beat came for ``hang_s``."""

    def __init__(self) -> None:
        self.last_s = time.monotonic()

    def beat(self) -> None:
        self.last_s = time.monotonic()


@contextmanager
def watchdog(progress: Progress, hang_s: float, on_hang: Callable[[], None]) -> Iterator[list[bool]]:
    """Watch ``progress`` from a thread while the block runs; when it stalls for
    ``hang_s``, call ``on_hang`` once (it kills the system's process, so a system call
    blocked on its mount returns with an error) and set the yielded flag."""
    fired = [False]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCHDOG_POLL_S):
            if time.monotonic() - progress.last_s > hang_s:
                fired[0] = True
                on_hang()
                return

    progress.beat()
    thread = threading.Thread(target=watch, name="peers-watchdog", daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        stop.set()
        thread.join()


@contextmanager
def doing(what: str) -> Iterator[None]:
    """Turn an ``OSError`` into an ``OperationError`` naming the call that failed."""
    try:
        yield
    except OSError as e:
        raise OperationError(f"{what}: {errno.errorcode.get(e.errno or 0, 'error')} ({e.strerror or e})") from None


def sequential_read(path: Path, size: int) -> tuple[float, float]:
    """dd bs=1M of ``path`` to /dev/null: (MB/s, seconds). Fails unless dd copied ``size`` bytes."""
    try:
        result = dd(path, "/dev/null")
    except BenchError as e:
        raise OperationError(str(e)) from None
    if result.nbytes != size:
        raise OperationError(f"dd read {result.nbytes} bytes, not {size}")
    return result.mb_per_s, result.seconds


def random_reads(path: Path, payload: bytes, count: int, seed: int, *, distinct_blocks: bool,
                 beat: Callable[[], None]) -> list[float]:
    """Seconds of each 4 KiB pread (see the module docstring)."""
    rng = random.Random(seed)
    blocks = len(payload) // BLOCK_BYTES
    if distinct_blocks and blocks:
        chosen = rng.sample(range(blocks), min(count, blocks))
        offsets = [b * BLOCK_BYTES + rng.randrange(BLOCK_BYTES // READ_BYTES) * READ_BYTES for b in chosen]
    else:
        offsets = [rng.randrange(len(payload) // READ_BYTES) * READ_BYTES for _ in range(count)]
    latencies = []
    with doing("open(O_RDONLY)"):
        fd = os.open(path, os.O_RDONLY)
    try:
        for offset in offsets:
            start = time.perf_counter()
            with doing(f"pread of 4 KiB at {offset}"):
                data = os.pread(fd, READ_BYTES, offset)
            latencies.append(time.perf_counter() - start)
            beat()
            if data != payload[offset : offset + READ_BYTES]:
                raise OperationError(f"pread of 4 KiB at {offset} returned wrong bytes")
    except BaseException:
        _close_after_error(fd)
        raise
    with doing("close"):
        os.close(fd)
    return latencies


@dataclasses.dataclass(frozen=True)
class AppendRun:
    appended: int
    seconds: float
    in_s3_at_last_fsync: int  # bytes S3 held right after the last fsync
    stopped_early: bool  # the deadline came first

    @property
    def rate(self) -> float:
        return self.appended / self.seconds if self.seconds > 0 else float("nan")


def appends(path: Path, count: int, deadline_s: float, bytes_in_s3: Callable[[], int],
            beat: Callable[[], None]) -> AppendRun:
    """``count`` × (write 4 KiB + fsync) on one O_APPEND descriptor (see the docstring)."""
    block = random.Random(count).randbytes(APPEND_BYTES)
    with doing("open(O_WRONLY|O_APPEND|O_CREAT) of a new file"):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    done = 0
    try:
        start = time.perf_counter()
        while done < count and time.perf_counter() - start < deadline_s:
            with doing(f"append {done + 1} (write 4 KiB, fsync)"):
                if os.write(fd, block) != APPEND_BYTES:
                    raise OperationError(f"a short write after {done} appends")
                os.fsync(fd)
            done += 1
            beat()
        seconds = time.perf_counter() - start
        held = bytes_in_s3()
    except BaseException:
        _close_after_error(fd)
        raise
    with doing(f"close after {done} appends"):
        os.close(fd)
    return AppendRun(done, seconds, held, done < count)


def _close_after_error(fd: int) -> None:
    """Close ``fd`` while another error is on its way (which is the one to report)."""
    with suppress(OSError):
        os.close(fd)


def settle(snapshot: Callable[[], Traffic], min_s: float, condition: Callable[[], bool], beat: Callable[[], None],
           timeout_s: float = SETTLE_TIMEOUT_S) -> float:
    """Wait at least ``min_s``, then until ``condition()`` holds and no PUT, POST or
    DELETE has gone through the proxy for ``QUIET_S``. Returns the seconds until
    ``condition()`` first held (polled every ``SETTLE_POLL_S``); ``OperationError``
    after ``timeout_s``."""
    start = time.monotonic()
    time.sleep(min_s)
    last = snapshot()
    quiet_since = time.monotonic()
    held_after_s: float | None = None
    while True:
        if held_after_s is None and condition():
            held_after_s = time.monotonic() - start
        if held_after_s is not None and time.monotonic() - quiet_since >= QUIET_S:
            return held_after_s
        if time.monotonic() - start > timeout_s:
            raise OperationError(f"still uploading (or incomplete in S3) after {timeout_s:g} s")
        time.sleep(SETTLE_POLL_S)
        beat()
        now = snapshot()
        if any(m in traffic_difference(now, last) for m in WRITE_METHODS):
            quiet_since = time.monotonic()
        last = now


def wait_idle(snapshot: Callable[[], Traffic], timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait until less than ``IDLE_BYTES`` go through the proxy in ``IDLE_WINDOW_S``
    (a system may still be fetching or uploading after its operation returned: that
    traffic belongs to the operation). False if it never got that quiet."""
    deadline = time.monotonic() + timeout_s
    last = total(snapshot())
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW_S)
        now = total(snapshot())
        if (now.bytes_up - last.bytes_up) + (now.bytes_down - last.bytes_down) < IDLE_BYTES:
            return True
        last = now
    return False


def create_small_files(directory: Path, count: int, deadline_s: float, beat: Callable[[], None]) -> tuple[int, float]:
    """Create ``count`` files of ``SMALL_FILE_BYTES`` in ``directory``: (created, seconds)."""
    content = b"s" * SMALL_FILE_BYTES
    start = time.perf_counter()
    created = 0
    while created < count and time.perf_counter() - start < deadline_s:
        with doing(f"file {created + 1} (open O_CREAT|O_EXCL, write, close)"):
            fd = os.open(directory / f"f{created:06d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                written = os.write(fd, content)
            except BaseException:
                _close_after_error(fd)
                raise
            os.close(fd)
            if written != SMALL_FILE_BYTES:
                raise OperationError(f"a short write to file {created + 1}")
        created += 1
        beat()
    return created, time.perf_counter() - start


def list_long(directory: Path, expected: int) -> float:
    """Seconds of ``ls -l DIR``; fails unless it lists ``expected`` entries."""
    start = time.perf_counter()
    done = subprocess.run(["ls", "-l", str(directory)], capture_output=True, text=True, timeout=LS_TIMEOUT_S)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise OperationError(f"ls -l failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    entries = sum(1 for line in done.stdout.splitlines() if not line.startswith("total "))
    if entries != expected:
        raise OperationError(f"ls -l listed {entries} of {expected} files")
    return seconds


def tail_latencies(path: Path, lines: int, seed: int, beat: Callable[[], None]) -> list[float]:
    """Seconds from each ``echo >> FILE`` until ``tail -f -s 0.01`` printed the line."""
    with doing("creating the file (open O_APPEND|O_CREAT, write, close)"), open(path, "ab") as first:
        first.write(b"started\n")
    tail = subprocess.Popen(["tail", "-f", "-s", "0.01", "-n", "1", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert tail.stdout is not None
    rng = random.Random(seed)
    pending = b""
    try:
        pending = _wait_for_line(tail, b"started", pending)
        latencies = []
        for i in range(lines):
            time.sleep(rng.uniform(*TAIL_GAP_S))
            line = f"line {i}".encode()
            start = time.perf_counter()
            with doing("appending a line to the existing file (open O_APPEND, write, close)"), \
                    open(path, "ab") as writer:
                writer.write(line + b"\n")
            pending = _wait_for_line(tail, line, pending)
            latencies.append(time.perf_counter() - start)
            beat()
        return latencies
    finally:
        tail.kill()
        tail.wait()
        for stream in (tail.stdout, tail.stderr):
            if stream is not None:
                stream.close()


def _wait_for_line(tail: subprocess.Popen[bytes], line: bytes, pending: bytes) -> bytes:
    """Read tail's output until ``line`` is a whole line of it; the bytes after it."""
    assert tail.stdout is not None
    fd = tail.stdout.fileno()
    deadline = time.perf_counter() + TAIL_TIMEOUT_S
    while True:
        lines = pending.split(b"\n")
        if line in lines[:-1]:
            return b"\n".join(lines[lines.index(line) + 1 :])
        left = deadline - time.perf_counter()
        if left <= 0:
            raise OperationError(f"tail -f did not show an appended line within {TAIL_TIMEOUT_S:g} s")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                error = tail.stderr.read().decode(errors="replace").strip() if tail.stderr else ""
                raise OperationError(f"tail exited ({tail.wait()}): {error[-300:]}")
            pending += chunk
