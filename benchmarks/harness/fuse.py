"""FUSE tools of the benchmarks: ``dd bs=1M`` with its own figures, a FUSE filesystem's
process (a peer, or the minimal filesystem of ``minimal_fs``) mounted until stopped,
and unmounting with whatever this host has.

Invariants: every timed write by ``dd_write`` starts after an untimed ``sync(2)``, so no
measurement pays for the writeback of what an earlier step left dirty; a mount process
is stopped by ``unmount`` (killed if it does not exit in time, the mount point detached)
and never outlives the benchmark.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from benchmarks import child_command, child_environment
from benchmarks.harness.figures import Throughput
from tierfs.testing.harness import HarnessError, wait_for_mount

MOUNT_TIMEOUT_S = 60.0  # a mount whose store is s3rver, on a loaded 2-core machine
UNMOUNT_TIMEOUT_S = 300.0  # a peer or tierfs uploads what is pending before it exits
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
    """Unmount with the first tool that succeeds (``lazy``: detach it even if busy or its
    process is gone; failures are ignored then)."""
    flag = "z" if lazy else ""
    for command in (["fusermount3", f"-u{flag}"], ["fusermount", f"-u{flag}"], ["umount", *(["-l"] if lazy else [])]):
        if shutil.which(command[0]) and subprocess.run([*command, str(mountpoint)], capture_output=True).returncode == 0:
            return
    if not lazy:
        raise BenchError(f"could not unmount {mountpoint}")


class MountProcess:
    """A foreground FUSE process on ``mountpoint``, mounted when constructed."""

    def __init__(self, command: list[str], mountpoint: Path, log_path: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.mountpoint, self.log_path = mountpoint, log_path
        mountpoint.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as sink:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                                            env=dict(env if env is not None else os.environ))
        try:
            wait_for_mount(mountpoint, self.process, timeout_s=MOUNT_TIMEOUT_S, describe=self.log_tail)
        except HarnessError as e:
            fuse_unmount(mountpoint, lazy=True)
            raise BenchError(f"{command[0]} did not mount {mountpoint}: {e}") from None

    @classmethod
    def minimal(cls, mountpoint: Path, log_path: Path, *args: str) -> MountProcess:
        """The minimal pyfuse3 filesystem (``minimal_fs``) with ``args``."""
        command = child_command("benchmarks.harness.minimal_fs", str(mountpoint), *args)
        return cls(command, mountpoint, log_path, child_environment())

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def unmount(self) -> None:
        try:
            if os.path.ismount(self.mountpoint):
                fuse_unmount(self.mountpoint)
            self.process.wait(timeout=UNMOUNT_TIMEOUT_S)
        except (BenchError, subprocess.TimeoutExpired) as e:
            self.kill()
            raise BenchError(f"{self.mountpoint} did not unmount and exit within {UNMOUNT_TIMEOUT_S:g} s ({e}); "
                             "killed") from None

    def kill(self) -> None:
        """SIGKILL (a hung mount): calls blocked on it return an error; the mount point is detached."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        fuse_unmount(self.mountpoint, lazy=True)
