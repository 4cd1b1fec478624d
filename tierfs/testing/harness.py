"""The one harness for real tierfs processes, used by the tests and the benchmarks.

- ``small_config``: a ``StoreConfig`` whose thresholds are small enough that flushes,
  chunk and journal rollover and VD syncs happen within milliseconds;
- ``start_daemon`` / ``Daemon``: a ``tierfs serve`` process on a data dir;
- ``Mount``: a ``tierfs mount --foreground`` process, the daemon serving a FUSE mount;
- ``wait_for_mount``: wait until any FUSE process has mounted its mount point;
- ``free_port``, ``process_environment``: a free TCP port, a child's environment.

Invariants:

- Every process runs ``python -m tierfs.cli --data-dir D [--config F] [-v] COMMAND``
  with this interpreter, so it runs the same tierfs as the caller (forked from a warm
  interpreter with ``TIERFS_WARM_START=1``: ``warm_start``).
- When ``start_daemon`` or ``Mount(...)`` returns, the process is ready (its socket
  answers ``/v1/health``; for a mount, the mount point is mounted as well). Otherwise
  the process has been killed and ``HarnessError`` says why, with the end of its
  stderr: a caller never holds a half-started process.
- A process's stderr goes to a file (``log_path``, or an anonymous temporary file),
  never to a pipe nobody reads, so a verbose daemon never blocks on a full pipe.
  ``stop()``, ``unmount()`` and ``wait()`` return everything it wrote there.
- A process that does not exit within its timeout is killed (SIGKILL) and reported
  with ``HarnessError``: it never outlives the test or benchmark that started it.
- No pytest: tierfs users import this without the test extras.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from tierfs.contracts.config import StoreConfig
from tierfs.testing import warm_start

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

KiB = 1 << 10
START_TIMEOUT_S = 30.0  # a daemon answers within ~1 s; 30 s rides out a loaded CI machine
STOP_TIMEOUT_S = 30.0  # a clean shutdown flushes to tier-2 first
POLL_INTERVAL_S = 0.05
STDERR_TAIL_CHARS = 2000  # how much of a failed process's stderr an error message quotes
SOCKET_NAME = "tierfs.sock"  # the daemon's API socket inside its data dir


class HarnessError(RuntimeError):
    """A tierfs process did not start, or did not exit in time (it has been killed)."""


def small_config(data_dir: Path, **overrides: object) -> StoreConfig:
    """A config whose thresholds are small enough that tests see flushes, rollover
    of chunks and journal files, and VD syncs within milliseconds."""
    values: dict[str, object] = dict(
        data_dir=data_dir,
        flush_interval_s=0.05,
        flush_bytes=64 * KiB,
        max_chunk_bytes=256 * KiB,
        max_flush_bytes=128 * KiB,
        journal_file_bytes=128 * KiB,
        vd_sync_interval_s=0.2,
    )
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


def processes() -> Iterator[tuple[int, int, bytes]]:
    """(pid, parent pid, command line with its NUL separators) of every process but
    this one (Linux ``/proc``; one that ends meanwhile is skipped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        yield int(entry), parent, command


def crash_copy(data_dir: Path, to: Path, *also_left_out: str) -> None:
    """Copy a data dir a store is running in, as a crash at that moment could leave it:
    without its lock and sockets, and without the files a writer renamed away meanwhile
    (a backup object written aside, then renamed, is there whole or not at all)."""
    def copy_if_there(source: str, target: str) -> object:
        try:
            return shutil.copy2(source, target)
        except FileNotFoundError:
            return target

    shutil.copytree(data_dir, to, copy_function=copy_if_there, ignore=shutil.ignore_patterns(
        "LOCK", "*.sock", "metadata.backup.tmp*", *also_left_out))


def disk_scratch_dir(prefix: str) -> Path:
    """A new directory with a short path (a daemon's Unix socket lives below it) on a real
    disk: in /tmp, unless /tmp is in RAM (Debian 13 and others mount a tmpfs there), then
    in /var/tmp."""
    tmp, fs_type, longest = os.path.realpath("/tmp"), "", -1
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            mount_point, kind = line.split()[1:3]
            inside = tmp == mount_point or tmp.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= longest:
                fs_type, longest = kind, len(mount_point)
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp" if fs_type in ("tmpfs", "ramfs") else "/tmp"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_environment(
    overrides: Mapping[str, str] | None = None, *, drop_tierfs: bool = False
) -> dict[str, str]:
    """This process's environment plus ``overrides``. With ``drop_tierfs`` the
    ``TIERFS_*`` variables are left out first, so only the child's flags, config file,
    ``overrides`` and the defaults apply (what a benchmark measures must not depend on
    the shell it was started from)."""
    env = {k: v for k, v in os.environ.items() if not (drop_tierfs and k.startswith("TIERFS_"))}
    env.update(overrides or {})
    return env


def wait_for_mount(
    mountpoint: Path,
    proc: warm_start.Process,
    *,
    also_exists: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
    describe: Callable[[], str] = lambda: "",
) -> None:
    """Wait until ``proc`` has mounted ``mountpoint`` (and ``also_exists`` exists).
    If ``proc`` exits first or the time runs out, it is killed and ``HarnessError``
    raised, quoting ``describe()`` (e.g. the end of its stderr)."""
    deadline = time.monotonic() + timeout_s
    while not (os.path.isdir(mountpoint) and os.path.ismount(mountpoint)
               and (also_exists is None or also_exists.exists())):
        if proc.poll() is not None:
            raise HarnessError(f"mount exited: {describe()}")
        if time.monotonic() > deadline:
            _kill(proc)
            raise HarnessError(f"the mount did not come up within {timeout_s:g} s: {describe()}")
        time.sleep(POLL_INTERVAL_S)


def _close_dropped_clients() -> None:
    """Close the connections of this process's API clients that nothing references any
    more (dropped without ``close()``, waiting for the garbage collector): a stopping
    daemon gives each connection still open its HTTP server's grace period (3 s) first."""
    gc.collect()


def _kill(proc: warm_start.Process) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class TierProcess:
    """One ``python -m tierfs.cli`` process owning ``data_dir`` (see the module
    docstring). Subclasses start it ready: ``Daemon`` via ``start_daemon``, ``Mount``."""

    def __init__(
        self,
        data_dir: Path,
        command: Sequence[str],
        *,
        config_file: Path | None = None,
        env: Mapping[str, str] | None = None,
        drop_tierfs_env: bool = False,
        log_path: Path | None = None,
        verbose: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.socket = data_dir / SOCKET_NAME
        self.url = f"unix://{self.socket}"
        self.log_path = log_path
        argv = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir)]
        if config_file is not None:
            argv += ["--config", str(config_file)]
        if verbose:  # INFO logs, for whoever reads a failure; benchmarks turn it off
            argv.append("-v")
        argv += command
        self._stderr: IO[bytes] = (
            open(log_path, "w+b") if log_path is not None else tempfile.TemporaryFile()
        )
        self._final_stderr: str | None = None
        self.proc: warm_start.Process = warm_start.start(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env=process_environment(env, drop_tierfs=drop_tierfs_env),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self) -> str:
        """Everything the process wrote to stderr so far (read with pread: the child
        shares the file's offset, so this handle's offset is never moved)."""
        if self._final_stderr is not None:
            return self._final_stderr
        fd = self._stderr.fileno()
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        return data.decode(errors="replace")

    def stderr_tail(self) -> str:
        return self.stderr_text()[-STDERR_TAIL_CHARS:]

    def client(self) -> TierClient:
        """A new API client on the process's socket (the caller closes it)."""
        from tierfs.remote.client import TierClient

        return TierClient(self.url)

    def metrics(self) -> dict[str, float]:
        """The process's ``/metrics`` as {name: value}, on a connection closed after."""
        client = self.client()
        try:
            return client.metrics()
        finally:
            client.close()

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> tuple[int, str]:
        """Wait for the process to exit by itself; its exit code and whole stderr.
        Killed, and ``HarnessError``, if it is still running after ``timeout_s``."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            self._finish()
            raise HarnessError(
                f"pid {self.proc.pid} did not exit within {timeout_s:g} s (killed): "
                f"{self.stderr_tail()}"
            ) from None
        self._finish()
        return code, self.stderr_text()

    def kill9(self) -> None:
        """SIGKILL, as a crash or an operator's ``kill -9``; waits until it is gone."""
        self.proc.kill()
        self.wait(timeout_s=STOP_TIMEOUT_S)

    def _finish(self) -> None:
        """Keep the whole stderr and close the file (the process has exited)."""
        if self._final_stderr is None:
            self._final_stderr = self.stderr_text()
            self._stderr.close()

    def _fail_start(self, message: str) -> HarnessError:
        _kill(self.proc)
        self._finish()
        return HarnessError(f"{message}: {self.stderr_tail()}")

    def _answers_health(self) -> bool:
        if not self.socket.exists():
            return False
        client = self.client()
        try:
            client.health()
            return True
        except Exception:  # not listening yet, or mid-start
            return False
        finally:
            client.close()


class Daemon(TierProcess):
    """A real ``tierfs serve`` process on a data dir (started by ``start_daemon``)."""

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` (SIGTERM: the daemon flushes, closes and exits) unless it has
        exited already; clients of this process that nothing references are closed
        first (``_close_dropped_clients``)."""
        if self.proc.poll() is None:
            _close_dropped_clients()
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> tuple[int, str]:
        """``terminate``, then ``wait``: its exit code and whole stderr."""
        self.terminate(sig)
        return self.wait(timeout_s)


def start_daemon(
    data_dir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    drop_tierfs_env: bool = False,
    log_path: Path | None = None,
    verbose: bool = True,
    timeout_s: float = START_TIMEOUT_S,
) -> Daemon:
    """``tierfs serve ARGS`` on ``data_dir``, returned once its socket answers
    ``/v1/health``. ``env`` is added to this process's environment."""
    daemon = Daemon(data_dir, ["serve", *args], config_file=config_file, env=env,
                    drop_tierfs_env=drop_tierfs_env, log_path=log_path, verbose=verbose)
    deadline = time.monotonic() + timeout_s
    while not daemon._answers_health():
        if daemon.proc.poll() is not None:
            raise daemon._fail_start("daemon exited")
        if time.monotonic() > deadline:
            raise daemon._fail_start(f"daemon did not start within {timeout_s:g} s")
        time.sleep(POLL_INTERVAL_S)
    return daemon


class Mount(TierProcess):
    """A real ``tierfs mount MOUNTPOINT --foreground ARGS`` process: the daemon serving
    a FUSE mount. Ready when constructed: mounted, and its API socket is there."""

    def __init__(
        self,
        data_dir: Path,
        mountpoint: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        config_file: Path | None = None,
        drop_tierfs_env: bool = False,
        log_path: Path | None = None,
        verbose: bool = True,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        super().__init__(data_dir, ["mount", str(mountpoint), "--foreground", *args],
                         config_file=config_file, env=env, drop_tierfs_env=drop_tierfs_env,
                         log_path=log_path, verbose=verbose)
        self.mountpoint = mountpoint
        try:
            wait_for_mount(mountpoint, self.proc, also_exists=self.socket, timeout_s=timeout_s,
                           describe=self.stderr_tail)
        except HarnessError:
            self._finish()
            raise

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def unmount(self, timeout_s: float = STOP_TIMEOUT_S) -> tuple[int, str]:
        """``tierfs umount`` (the daemon flushes, closes and exits), then ``wait``:
        the daemon's exit code and whole stderr."""
        from tierfs.fuse.mount import is_mount_point

        if is_mount_point(self.mountpoint):
            _close_dropped_clients()
            from tierfs.testing.cli_runner import run_tierfs

            done = run_tierfs("umount", str(self.mountpoint))  # the command, in this process
            if done.returncode != 0:
                raise HarnessError(f"tierfs umount {self.mountpoint}: {done.stderr.decode(errors='replace')}")
        return self.wait(timeout_s)
