"""Mounts and daemons of the benchmarks: tierfs's own (``tierfs serve`` and ``tierfs
mount`` by the shared harness, ``TIERFS_*`` left out, no ``-v``, the log and the
configuration file beside the data dir), another FUSE filesystem's process (a peer, or
``minimal_fs``) mounted until stopped, unmounting, and ``dd bs=1M`` with its own figures.

Invariants: a daemon or mount started here is stopped when its block ends or by
``unmount`` (a FUSE process is killed if it does not exit in time, the mount point
detached), so none outlives the benchmark; a timed write by ``dd_write`` starts after an
untimed ``sync(2)`` (it pays for no earlier step's writeback).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from benchmarks import child_command, child_environment
from benchmarks.harness.figures import Throughput
from benchmarks.harness.s3 import BUCKET
from benchmarks.harness.scenario import say
from tierfs.testing.harness import Daemon, HarnessError, Mount, start_daemon, wait_for_mount

START_TIMEOUT_S = 60.0  # a store whose tier-2 is s3rver, on a loaded 2-core machine
STOP_TIMEOUT_S = 300.0  # it uploads what is pending before it exits
_DD = re.compile(r"^(\d+) bytes .* copied, ([\d.e+-]+) s", re.MULTILINE)


class BenchError(RuntimeError):
    """The benchmark cannot run here, or a system failed (the message says why)."""


def require(*programs: str) -> None:
    """``BenchError`` unless /dev/fuse and every one of ``programs`` are there."""
    missing = [p for p in programs if shutil.which(p) is None] + ([] if os.path.exists("/dev/fuse") else ["/dev/fuse"])
    if missing:
        raise BenchError(f"missing here: {', '.join(missing)}")


def dd(source: Path | str, target: Path | str, count_mib: int | None = None) -> Throughput:
    """``dd bs=1M`` and its own byte count and seconds."""
    command = ["dd", f"if={source}", f"of={target}", "bs=1M", *([f"count={count_mib}"] if count_mib else [])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    match = _DD.search(result.stderr)
    if result.returncode != 0 or match is None:
        raise BenchError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    return Throughput(f"dd {source} -> {target}", int(match.group(1)), float(match.group(2)))


def dd_write(target: Path, count_mib: int) -> Throughput:
    """``dd if=/dev/zero bs=1M`` into ``target`` after an untimed sync(2)."""
    os.sync()
    return dd("/dev/zero", target, count_mib)


def fuse_unmount(mountpoint: Path, *, lazy: bool = False) -> None:
    """``fusermount3 -u`` (``lazy``: ``-uz``, detach it even if busy or its process is
    gone; failures are ignored then)."""
    done = subprocess.run(["fusermount3", "-uz" if lazy else "-u", str(mountpoint)], capture_output=True)
    if done.returncode != 0 and not lazy:
        raise BenchError(f"could not unmount {mountpoint}: {done.stderr.decode(errors='replace').strip()}")


class MountProcess:
    """A foreground FUSE process on ``mountpoint``, mounted when constructed."""

    def __init__(self, command: list[str], mountpoint: Path, log_path: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as sink:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                            env=dict(env if env is not None else os.environ))
        try:
            wait_for_mount(mountpoint, self.process, timeout_s=START_TIMEOUT_S,
                           describe=lambda: log_path.read_text(errors="replace")[-2000:])
        except HarnessError as e:
            fuse_unmount(mountpoint, lazy=True)
            raise BenchError(f"{command[0]} did not mount {mountpoint}: {e}") from None

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def minimal(cls, mountpoint: Path, log_path: Path, *args: str) -> MountProcess:
        """The minimal pyfuse3 filesystem (``minimal_fs``) with ``args``."""
        command = child_command("benchmarks.harness.minimal_fs", str(mountpoint), *args)
        return cls(command, mountpoint, log_path, child_environment())

    def unmount(self) -> None:
        try:
            if os.path.ismount(self.mountpoint):
                fuse_unmount(self.mountpoint)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except (BenchError, subprocess.TimeoutExpired) as e:
            self.kill()
            raise BenchError(f"{self.mountpoint} did not unmount and exit within {STOP_TIMEOUT_S:g} s ({e}); "
                             "killed") from None

    def kill(self) -> None:
        """SIGKILL (a hung mount): calls blocked on it return an error; the mount point is detached."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        fuse_unmount(self.mountpoint, lazy=True)


def s3_tier2(endpoint_url: str, bucket: str = BUCKET, **settings: object) -> str:
    """A configuration: tier-2 ``s3://BUCKET/chunks`` on ``endpoint_url`` (keys from the environment)."""
    settings = {"tier2_url": f"s3://{bucket}/chunks", "tier2_endpoint_url": endpoint_url, **settings}
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())


def _config_file(data_dir: Path, config: str | None) -> Path | None:
    if config is None:
        return None
    path = data_dir.parent / f"{data_dir.name}.toml"
    path.write_text(config)
    return path


@contextmanager
def serving(data_dir: Path, config: str | None = None, env: Mapping[str, str] | None = None) -> Iterator[Daemon]:
    """``tierfs serve`` on ``data_dir`` with the configuration text ``config``."""
    daemon = start_daemon(data_dir, config_file=_config_file(data_dir, config), env=env, drop_tierfs_env=True,
                          log_path=data_dir.parent / f"{data_dir.name}.log", verbose=False, timeout_s=START_TIMEOUT_S)
    try:
        yield daemon
    finally:
        daemon.stop(timeout_s=STOP_TIMEOUT_S)


def start_mount(data_dir: Path, mountpoint: Path, *args: str, config: str | None = None,
                env: Mapping[str, str] | None = None) -> Mount:
    """``tierfs mount MOUNTPOINT ARGS`` on ``data_dir`` with the configuration text ``config``."""
    return Mount(data_dir, mountpoint, *args, config_file=_config_file(data_dir, config), env=env,
                 drop_tierfs_env=True, log_path=data_dir.parent / f"{data_dir.name}.log", verbose=False,
                 timeout_s=START_TIMEOUT_S)


@contextmanager
def mounted(data_dir: Path, mountpoint: Path, *args: str, config: str | None = None,
            env: Mapping[str, str] | None = None) -> Iterator[Mount]:
    """``start_mount``, unmounted when the block ends."""
    mount = start_mount(data_dir, mountpoint, *args, config=config, env=env)
    try:
        yield mount
    finally:
        code, stderr = mount.unmount(timeout_s=STOP_TIMEOUT_S)
        if code != 0:
            say(f"the tierfs mount exited with {code}:\n{stderr[-2000:]}")
