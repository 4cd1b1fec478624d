"""``tierfs tail`` at GNU tail's level (issue 20, item 4), run as a user runs it: a real
``python -m tierfs.cli`` process whose stdout and stderr are read as they come, against
a real daemon (``start_daemon``) and in-process (no daemon on the data dir).

- What is printed first (``-n [+]N``, ``-c [+]N``, headers for several files, ``-q``,
  ``-v``, a missing name, a directory, ``--pid`` without a follow) is compared byte
  for byte, stderr and exit code included, with GNU tail reading the same bytes from
  plain files of the same names.
- Following: headers again each time the output switches files; ``-F`` across a
  rename (what the old segment got just before is printed), a delete and a re-create,
  and a rename onto the name; ``-f`` across a rename in the directory, ending with
  "no files remaining" once the segment is deleted; ``--follow=name`` without retry;
  ``--pid`` ends tail, with the bytes appended before the process ended, through the
  daemon and in-process; a PD append through the API reaches tail's stdout (the time
  is printed, never asserted: speed lives in ``python -m benchmarks tail``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import trio

from tierfs import open_store
from tierfs.contracts import operations as ops
from tierfs.remote.client import TierClient
from tierfs.testing.cli_runner import run_tierfs
from tierfs.testing.harness import Daemon, small_config, start_daemon

WAIT_S = 30.0  # what a step may take on a loaded machine (a name change is seen within ~1-2 s)

# The files the first-part comparisons read, as plain files for GNU tail and segments for tierfs
FILES = {
    "logs/a": b"".join(b"a%d\n" % i for i in range(1, 13)),
    "logs/b": b"b1\nb2",  # no final newline
    "logs/empty": b"",
}
DIRECTORY = "logs/sub"

FIRST_PART_CASES = [
    ["logs/a"],
    ["logs/a", "logs/b"],
    ["-n", "+3", "logs/a"],
    ["-n", "+0", "logs/b"],
    ["-n", "3", "logs/a", "logs/empty", "logs/b"],
    ["-n", "-2", "logs/a"],
    ["-n", "0", "logs/a"],
    ["-n", "+20", "logs/a"],
    ["-c", "+5", "logs/a"],
    ["-c", "7", "logs/b"],
    ["-q", "logs/a", "logs/b"],
    ["-v", "-n", "1", "logs/b"],
    ["-v", "-q", "-n", "2", "logs/a"],
    ["logs/a", "logs/missing", "logs/b"],
    [DIRECTORY],
    ["--pid", "1", "-n", "1", "logs/a"],
    ["-n", "0", "logs/a", "logs/b", "logs/missing"],  # nothing at all: no headers, no error
    ["-c", "0", "logs/a", "logs/b"],
    ["-c", "1b", "logs/a"],  # b: 512-byte blocks
    ["-c", "+1b", "logs/a"],
]


def _is_gnu_tail() -> bool:
    path = shutil.which("tail")
    if path is None:
        return False
    return b"GNU coreutils" in subprocess.run([path, "--version"], capture_output=True).stdout


def _tierfs(data_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """A tail that ends, run in this process; a following one runs as a process (TailProcess)."""
    return run_tierfs("--data-dir", str(data_dir), *args)


def _fill(data_dir: Path, files: dict[str, bytes], directory: str) -> None:
    async def fill() -> None:
        async with open_store(small_config(data_dir)) as store:
            await store.mkdir(directory, parents=True)
            for name, data in files.items():
                await store.create(name, make_parents=True)
                if data:
                    await store.append(name, data)

    trio.run(fill)


@pytest.fixture(scope="module")
def gnu_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gnu")
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / DIRECTORY).mkdir()
    return root


@pytest.fixture(scope="module")
def local_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("local") / "data"
    _fill(data_dir, FILES, DIRECTORY)
    return data_dir


@pytest.fixture(scope="module")
def served_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data_dir = tmp_path_factory.mktemp("served") / "data"
    _fill(data_dir, FILES, DIRECTORY)
    running = start_daemon(data_dir)
    yield data_dir
    running.stop()


@pytest.mark.skipif(not _is_gnu_tail(), reason="compares with GNU tail (coreutils)")
@pytest.mark.parametrize("where", ["daemon", "in-process"])
@pytest.mark.parametrize("args", FIRST_PART_CASES, ids=" ".join)
def test_first_part_is_gnu_tails(args: list[str], where: str, gnu_files: Path, local_data_dir: Path,
                                 served_data_dir: Path) -> None:
    gnu = subprocess.run(["tail", *args], cwd=gnu_files, capture_output=True, timeout=WAIT_S)
    ours = _tierfs(served_data_dir if where == "daemon" else local_data_dir, "tail", *args)
    assert (ours.returncode, ours.stdout, ours.stderr.decode()) == (gnu.returncode, gnu.stdout, gnu.stderr.decode())


def test_tail_options_after_the_paths_and_units(served_data_dir: Path) -> None:
    done = _tierfs(served_data_dir, "tail", "logs/a", "--bytes", "1KiB", "--verbose")
    assert done.returncode == 0 and done.stdout == b"==> logs/a <==\n" + FILES["logs/a"]
    assert _tierfs(served_data_dir, "tail", "-n", "1k", "logs/a").stdout == FILES["logs/a"]
    bad = _tierfs(served_data_dir, "tail", "-n", "x", "logs/a")
    assert bad.returncode == 2 and b"invalid number of lines: 'x'" in bad.stderr and not bad.stdout


def test_minus_n_minus_count_is_the_last_lines_without_gnu_tail(served_data_dir: Path) -> None:
    """``-n -2`` is GNU's spelling of the last 2 lines (also compared with GNU tail above,
    where GNU tail is installed); ``-n 2x`` is refused (tests/test_input_everywhere.py)."""
    done = _tierfs(served_data_dir, "tail", "-n", "-2", "logs/a")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"a11\na12\n", b"")


# ------------------------------------------------------------------ following
class Pipe:
    """What a process writes to one pipe, collected by a thread as it comes, with the
    time each piece arrived."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        self.data = b""
        self.arrivals: list[tuple[float, int]] = []  # (monotonic time, length so far)
        self._changed = threading.Condition()
        self._fd = stream.fileno()
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        while piece := os.read(self._fd, 65536):
            with self._changed:
                self.data += piece
                self.arrivals.append((time.monotonic(), len(self.data)))
                self._changed.notify_all()

    def wait(self, done: Callable[[bytes], bool], what: str) -> bytes:
        with self._changed:
            if not self._changed.wait_for(lambda: done(self.data), timeout=WAIT_S):
                raise AssertionError(f"waited {WAIT_S:g} s for {what}; got {self.data!r}")
            return self.data

    def wait_for(self, text: bytes, times: int = 1) -> bytes:
        return self.wait(lambda data: data.count(text) >= times, f"{text!r} x{times}")

    def arrived_at(self, length: int) -> float:
        """When the first ``length`` bytes had all arrived."""
        with self._changed:
            return next(t for t, size in self.arrivals if size >= length)


class TailProcess:
    def __init__(self, data_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "tail", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out, self.err = Pipe(self.proc.stdout), Pipe(self.proc.stderr)

    def running(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> int:
        return self.proc.wait(timeout=WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


RunTail = Callable[..., TailProcess]  # (data dir, *tail's arguments) -> a running tail


@pytest.fixture
def run_tail() -> Iterator[RunTail]:
    started: list[TailProcess] = []

    def run(data_dir: Path, *args: str) -> TailProcess:
        started.append(TailProcess(data_dir, *args))
        return started[-1]

    yield run
    for tail in started:
        tail.stop()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[TierClient]:
    opened = daemon.client()
    yield opened
    opened.close()


def _segment(client: TierClient, name: str, data: bytes = b"") -> None:
    client.create(name, parents=True)
    if data:
        client.append(name, data)


def test_several_files_headers_switch_as_gnu_does(daemon: Daemon, client: TierClient, run_tail: RunTail) -> None:
    _segment(client, "h/one", b"1a\n")
    _segment(client, "h/two", b"2a\n")
    tail = run_tail(daemon.data_dir, "-f", "h/one", "h/two")
    tail.out.wait_for(b"==> h/two <==\n2a\n")
    for name, line in (("h/two", b"2b\n"), ("h/one", b"1b\n"), ("h/one", b"1c\n"), ("h/two", b"2c\n")):
        client.append(name, line)
        tail.out.wait_for(line)
    assert tail.out.data == (b"==> h/one <==\n1a\n\n==> h/two <==\n2a\n2b\n\n==> h/one <==\n1b\n1c\n"
                             b"\n==> h/two <==\n2c\n")
    assert tail.running() and tail.err.data == b""


def test_capital_f_follows_the_name_across_rename_delete_and_re_create(
        daemon: Daemon, client: TierClient, run_tail: RunTail) -> None:
    _segment(client, "r/app.log", b"one\n")
    tail = run_tail(daemon.data_dir, "-F", "-n", "+1", "r/app.log")
    tail.out.wait_for(b"one\n")
    client.append("r/app.log", b"two\n")
    tail.out.wait_for(b"two\n")
    # rotation: the last line lands just before the rename; tail prints it once, from wherever it is
    client.append("r/app.log", b"three\n")
    client.call(ops.MV, "r/app.log", "r/app.log.1")
    inaccessible = b"tail: 'r/app.log' has become inaccessible: No such file or directory\n"
    appeared = b"tail: 'r/app.log' has appeared;  following new file\n"
    tail.err.wait_for(inaccessible)
    _segment(client, "r/app.log", b"new\n")
    tail.err.wait_for(appeared)
    tail.out.wait_for(b"new\n")
    client.delete("r/app.log")
    tail.err.wait_for(inaccessible, times=2)
    _segment(client, "r/app.log", b"again\n")
    tail.err.wait_for(appeared, times=2)
    tail.out.wait_for(b"again\n")
    _segment(client, "r/other", b"other\n")  # a rename onto the name replaces the segment it holds
    client.call(ops.MV, "r/other", "r/app.log")
    tail.err.wait_for(b"tail: 'r/app.log' has been replaced;  following new file\n")
    tail.out.wait_for(b"other\n")
    client.append("r/app.log.1", b"not followed any more\n")
    client.append("r/app.log", b"more\n")
    tail.out.wait_for(b"more\n")
    assert tail.out.data == b"one\ntwo\nthree\nnew\nagain\nother\nmore\n"
    assert tail.err.data == inaccessible + appeared + inaccessible + appeared + (
        b"tail: 'r/app.log' has been replaced;  following new file\n")
    assert tail.running()


def test_capital_f_waits_for_a_name_that_does_not_exist_yet(daemon: Daemon, client: TierClient,
                                                             run_tail: RunTail) -> None:
    tail = run_tail(daemon.data_dir, "-F", "w/later.log")
    tail.err.wait_for(b"tail: cannot open 'w/later.log' for reading: No such file or directory\n")
    _segment(client, "w/later.log", b"first\n")
    tail.err.wait_for(b"tail: 'w/later.log' has appeared;  following new file\n")
    tail.out.wait_for(b"first\n")
    assert tail.running()


def test_small_f_follows_the_segment_across_a_rename_until_it_is_deleted(
        daemon: Daemon, client: TierClient, run_tail: RunTail) -> None:
    _segment(client, "d/app.log", b"old\n")
    tail = run_tail(daemon.data_dir, "-f", "d/app.log")
    tail.out.wait_for(b"old\n")
    client.call(ops.MV, "d/app.log", "d/app.log.1")
    _segment(client, "d/app.log", b"a new segment under the name: not followed by -f\n")
    client.append("d/app.log.1", b"after the rename\n")
    tail.out.wait_for(b"after the rename\n")
    client.delete("d/app.log.1")
    assert tail.exit_code() == 1
    assert tail.out.data == b"old\nafter the rename\n"
    assert tail.err.data == b"tail: d/app.log: No such file or directory\ntail: no files remaining\n"


def test_follow_name_without_retry_gives_up_on_a_deleted_name(daemon: Daemon, client: TierClient,
                                                              run_tail: RunTail) -> None:
    _segment(client, "n/a", b"a\n")
    _segment(client, "n/b", b"b\n")
    tail = run_tail(daemon.data_dir, "--follow=name", "-q", "n/a", "n/b")
    tail.out.wait_for(b"a\nb\n")
    client.delete("n/a")
    tail.err.wait_for(b"tail: n/a: No such file or directory\n")
    client.append("n/b", b"b2\n")
    tail.out.wait_for(b"b2\n")
    assert tail.running()
    client.delete("n/b")
    assert tail.exit_code() == 1
    assert tail.err.data.endswith(b"tail: n/b: No such file or directory\ntail: no files remaining\n")


def test_pid_ends_the_follow_through_the_daemon_with_what_came_before(
        daemon: Daemon, client: TierClient, run_tail: RunTail) -> None:
    _segment(client, "p/log", b"start\n")
    writer = subprocess.Popen(["sleep", "60"])
    try:
        tail = run_tail(daemon.data_dir, "-f", "--pid", str(writer.pid), "p/log")
        tail.out.wait_for(b"start\n")
        assert tail.running()
        client.append("p/log", b"last words\n")
    finally:
        writer.kill()
        writer.wait()
    assert tail.exit_code() == 0
    assert tail.out.data == b"start\nlast words\n" and tail.err.data == b""


def test_pid_ends_the_follow_in_process(local_data_dir: Path, run_tail: RunTail) -> None:
    writer = subprocess.Popen(["sleep", "60"])
    try:
        tail = run_tail(local_data_dir, "-F", "--pid", str(writer.pid), "-n", "1", "logs/a", "logs/b")
        tail.out.wait_for(b"b2")
        time.sleep(1.5)  # a follow in-process wakes at least every second: still following
        assert tail.running()
    finally:
        writer.kill()
        writer.wait()
    assert tail.exit_code() == 0
    assert tail.out.data == b"==> logs/a <==\na12\n\n==> logs/b <==\nb2"


def test_pid_of_a_process_already_gone_prints_and_ends(served_data_dir: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = _tierfs(served_data_dir, "tail", "-f", "--pid", str(gone.pid), "-n", "2", "logs/a")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"a11\na12\n", b"")


def test_a_pd_append_through_the_api_reaches_tails_stdout(daemon: Daemon, client: TierClient,
                                                          run_tail: RunTail) -> None:
    client.create("lat/log", durability="pd", parents=True)
    tail = run_tail(daemon.data_dir, "-f", "-n", "+1", "lat/log")
    client.append("lat/log", b"ready\n")
    tail.out.wait_for(b"ready\n")
    latencies_ms, expected = [], b"ready\n"
    for i in range(20):
        line = b"line %d\n" % i
        client.append("lat/log", line)
        acknowledged = time.monotonic()
        expected += line
        tail.out.wait(lambda data, size=len(expected): len(data) >= size, line.decode())
        latencies_ms.append((tail.out.arrived_at(len(expected)) - acknowledged) * 1000)
    assert tail.out.data == expected
    latencies_ms.sort()
    print(f"PD append acknowledged -> on tail's stdout: median {latencies_ms[10]:.1f} ms, "
          f"max {latencies_ms[-1]:.1f} ms (20 lines; timed by python -m benchmarks tail)")
