"""Start ``python -m tierfs.cli`` processes by forking an interpreter that has imported
tierfs already, instead of a new interpreter importing it again (~0.35 CPU-s per
daemon, paid some 200 times by the suite on two cores).

``start(argv, env=..., stdin=..., stdout=..., stderr=...)`` returns a process object
with ``subprocess.Popen``'s ``pid``, ``returncode``, ``poll``, ``wait``,
``send_signal``, ``terminate`` and ``kill``. It is a forked child of a warm server when
``TIERFS_WARM_START=1`` is set (the suite's conftest sets it) and the command can be
forked; otherwise, and whenever the server cannot be reached, a ``subprocess.Popen``.

Invariants:

- A forked child runs exactly what ``python -m tierfs.cli ARGS`` runs (``tierfs.cli``'s
  ``main``, then the interpreter's normal exit: atexit handlers, flushed streams), with
  the caller's environment, working directory and stdin/stdout/stderr (passed as file
  descriptors), in the caller's process group. It is a real process: ``kill -9``,
  SIGSTOP, ``/proc/<pid>`` and its exit code are what they would be.
- Only what an environment variable decides at start-up differs from a new interpreter,
  so a command is forked only when every such variable (``PYTHON*``, ``LD_*``,
  ``FSSPEC_*``, ``TMPDIR``) equals the server's; tierfs itself reads its environment
  when a command runs, never at import.
- The server has no thread and no trio run when it forks (both would be broken in the
  child), and forks only for the process that started it. It exits when that process
  ends (its stdin closes); children still running are the caller's to stop, as with
  ``subprocess``.
- Signals go through a pidfd the server opens right after the fork, before it can
  reap the child, and passes with the pid: a signal never reaches a later process
  that reused the pid, and a command that exits at once is never taken for one that
  did not start (which would run it a second time as a new interpreter).
- No pytest: imported by the harness, which tierfs users import without test extras.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ENABLE_VARIABLE = "TIERFS_WARM_START"
START_UP_VARIABLES = ("PYTHON", "LD_", "FSSPEC_", "TMPDIR")
# What ``tierfs serve`` and ``tierfs mount`` import when they start (``mount`` only
# where pyfuse3 is installed)
PRELOADED = ("tierfs.cli.parser", "tierfs.cli.execution", "tierfs.cli.commands.daemon",
             "tierfs.server.daemon", "tierfs.fuse.mount")
CLI_MAIN = str(Path(__file__).resolve().parent.parent / "cli" / "__main__.py")
MESSAGE_BYTES = 1 << 20  # one request: argv, environment, working directory
Stream = int | IO[Any] | None


def _startup_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(START_UP_VARIABLES)}


def _passable(stream: Stream) -> bool:
    """Whether a ``subprocess``-style stream argument can be passed as a file
    descriptor (``PIPE`` and ``STDOUT`` cannot: they ask for a new interpreter)."""
    return stream is None or stream == subprocess.DEVNULL or not isinstance(stream, int) or stream >= 0


def _fd(stream: Stream, inherited: int) -> tuple[int, bool]:
    """The file descriptor for a passable stream argument (``None``: the caller's own,
    ``inherited``), and whether it was opened here (and is closed once sent)."""
    if stream is None:
        return inherited, False
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), True
    return (stream, False) if isinstance(stream, int) else (stream.fileno(), False)


class WarmProcess:
    """A forked ``tierfs`` process: ``subprocess.Popen``'s interface for it."""

    def __init__(self, args: Sequence[str], pid: int, connection: socket.socket, pidfd: int) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self._pidfd = pidfd
        self._pending = b""

    def _read_exit(self, timeout_s: float | None) -> None:
        self._connection.settimeout(timeout_s)
        while b"\n" not in self._pending:
            try:
                data = self._connection.recv(64)
            except (TimeoutError, BlockingIOError):
                return
            if not data:  # the server is gone; the pidfd still says whether the child is
                self._reap_without_server(timeout_s)
                return
            self._pending += data
        line = self._pending.split(b"\n", 1)[0]
        self._finish(int(line.decode().split()[1]))

    def _reap_without_server(self, timeout_s: float | None) -> None:
        with selectors.DefaultSelector() as waiting:
            waiting.register(self._pidfd, selectors.EVENT_READ)
            if waiting.select(timeout_s):
                self._finish(-signal.SIGKILL)  # its exit code went with the server

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._connection.close()
        os.close(self._pidfd)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._read_exit(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Process = WarmProcess | subprocess.Popen[bytes]


class _Server:
    """The caller's end of one warm server (started on first use in each process)."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.directory = tempfile.mkdtemp(prefix="tierfs-warm-")
        self.socket_path = os.path.join(self.directory, "s")
        self.environment = _startup_environment(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, self.socket_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        try:
            if ready != b"ready\n":
                raise OSError(f"the warm-start server did not start ({ready!r})")
            os.close(os.pidfd_open(self.proc.pid))  # a kernel without pidfds: no fork, ever
        except OSError:
            self.proc.kill()
            self.proc.wait()
            raise

    def fork(self, argv: Sequence[str], env: Mapping[str, str], fds: list[int]) -> WarmProcess:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.socket_path)
            request = json.dumps({"argv": list(argv[3:]), "env": dict(env), "cwd": os.getcwd()}).encode()
            socket.send_fds(connection, [request], fds)
            connection.shutdown(socket.SHUT_WR)
            answer, fds, _, _ = socket.recv_fds(connection, 64, 1)
            if not answer.endswith(b"\n") or len(fds) != 1:  # not forked (one message, or none)
                for fd in fds:
                    os.close(fd)
                raise OSError(f"the warm-start server did not fork: {answer!r}")
            return WarmProcess(argv, int(answer.split()[1]), connection, fds[0])
        except BaseException:
            connection.close()
            raise


_server: _Server | None = None
_unavailable_in: int | None = None  # the process whose server could not start


def _can_fork(argv: Sequence[str], streams: Sequence[Stream]) -> bool:
    return (os.environ.get(ENABLE_VARIABLE) == "1" and list(argv[:3]) == [sys.executable, "-m", "tierfs.cli"]
            and all(_passable(stream) for stream in streams)
            and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"))


def start(argv: Sequence[str], *, env: Mapping[str, str], stdin: Stream = None, stdout: Stream = None,
          stderr: Stream = None) -> Process:
    """``subprocess.Popen(argv, env=env, stdin=..., stdout=..., stderr=...)``, forked
    from the warm server where it can be (see the module docstring)."""
    global _server, _unavailable_in
    if _can_fork(argv, (stdin, stdout, stderr)) and _unavailable_in != os.getpid():
        try:
            if _server is None or _server.owner_pid != os.getpid() or _server.proc.poll() is not None:
                _server = None
                _unavailable_in = os.getpid()  # until it answers: one try per process
                _server = _Server()
                _unavailable_in = None
            if _startup_environment(env) == _server.environment:
                opened = [_fd(stream, inherited) for inherited, stream in enumerate((stdin, stdout, stderr))]
                try:
                    return _server.fork(argv, env, [fd for fd, _ in opened])
                finally:
                    for fd, mine in opened:
                        if mine:
                            os.close(fd)
        except OSError:
            pass  # a new interpreter, below, as without warm start
    return subprocess.Popen(list(argv), env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr)


# -- the server -------------------------------------------------------------------------


def _serve(socket_path: str) -> dict[str, Any]:
    """Answer fork requests until the caller's end of stdin closes (then exit). Returns
    only in a forked child: its request, with its file descriptors in ``"fds"``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up byte is what counts
    waiting: dict[int, socket.socket] = {}  # child pid -> its caller's connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "caller")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    gc.freeze()  # what is imported stays shared between the children, never copied
    while True:
        for key, _ in selector.select():
            if key.data == "caller":
                if not os.read(sys.stdin.fileno(), 4096):
                    os.unlink(socket_path)
                    os.rmdir(os.path.dirname(socket_path))
                    os._exit(0)
            elif key.data == "child":
                os.read(wake_read, 4096)
                _report_exits(waiting)
            else:
                connection, _ = listener.accept()
                with contextlib.suppress(OSError, ValueError):
                    request = _read_request(connection)
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        listener.close()
                        for other in waiting.values():
                            other.close()
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        os.close(wake_read)
                        os.close(wake_write)
                        connection.close()
                        return request
                    for fd in request["fds"]:
                        os.close(fd)
                    waiting[pid] = connection
                    # the child's pidfd goes with its pid: opened here, before this loop
                    # can reap it, so it names this child even if it has exited already
                    try:
                        pidfd = os.pidfd_open(pid)
                    except OSError:
                        os.kill(pid, signal.SIGKILL)  # never run twice: the caller starts it anew
                        raise
                    try:
                        socket.send_fds(connection, [f"pid {pid}\n".encode()], [pidfd])
                    finally:
                        os.close(pidfd)
                    continue
                connection.close()


def _read_request(connection: socket.socket) -> dict[str, Any]:
    data, fds, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 3)
    while True:
        more = connection.recv(MESSAGE_BYTES)
        if not more:
            break
        data += more
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a request brings 3 file descriptors, not {len(fds)}")
    request: dict[str, Any] = json.loads(data)
    request["fds"] = fds
    return request


def _report_exits(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(f"exit {-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)}\n".encode())
            connection.close()


def _become(request: dict[str, Any]) -> None:
    """In the forked child: the caller's streams, environment and directory."""
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [CLI_MAIN, *request["argv"]]


if __name__ == "__main__":
    from tierfs.cli.parser import GC_THRESHOLDS

    gc.set_threshold(*GC_THRESHOLDS)
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            __import__(name)
    if threading.active_count() != 1:  # a fork would leave the others' locks held
        sys.exit(f"the warm-start server has {threading.active_count()} threads after its imports")
    _become(_serve(sys.argv[1]))
    from tierfs.cli.parser import main

    main()
