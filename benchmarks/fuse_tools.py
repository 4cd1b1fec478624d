"""Tools of the FUSE benchmarks (``fuse_mount``, ``fuse_writes``, ``peer_operations``):
``dd bs=1M`` with its own figures, and the minimal pyfuse3 filesystem
(``benchmarks/fuse_ceiling.py``) mounted in a child process.

Invariant: every timed write starts after an untimed ``sync(2)`` (``dd_write``), so no
measurement pays for the writeback of what an earlier step left dirty; a ceiling mount
is unmounted by ``close`` (its process killed if it does not exit).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from benchmarks import child_command, child_environment
from benchmarks.common import Throughput
from tierfs.testing.harness import wait_for_mount

START_TIMEOUT_S = 60.0  # a mount whose tier-2 is s3rver, on a loaded machine
STOP_TIMEOUT_S = 120.0  # unmounting flushes the last VD writes to S3
_DD = re.compile(r"^(\d+) bytes .* copied, ([\d.e+-]+) s", re.MULTILINE)


class BenchError(RuntimeError):
    """The benchmark cannot run here (the message says why)."""


def dd(source: Path | str, target: Path | str, count_mib: int | None = None) -> Throughput:
    """``dd bs=1M`` and its own byte count and seconds."""
    command = ["dd", f"if={source}", f"of={target}", "bs=1M"]
    if count_mib is not None:
        command.append(f"count={count_mib}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    match = _DD.search(result.stderr)
    if result.returncode != 0 or match is None:
        raise BenchError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    return Throughput.of(f"dd {source} -> {target}", int(match.group(1)), float(match.group(2)))


def dd_write(target: Path, count_mib: int) -> Throughput:
    """``dd if=/dev/zero bs=1M`` into ``target`` after an untimed sync(2), so the kernel
    is not still writing back what earlier steps left dirty while this write is timed."""
    os.sync()
    return dd("/dev/zero", target, count_mib)


class CeilingMount:
    """``python -m benchmarks.fuse_ceiling``, mounted on ``mountpoint`` until ``close``."""

    def __init__(self, mountpoint: Path, size: int, mode: str, log: Path, journal_dir: Path) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        args = [str(mountpoint), str(size), "--journal-dir", str(journal_dir)]
        if mode == "direct_io":
            args.append("--direct-io")
        with open(log, "ab") as sink:
            self.process = subprocess.Popen(child_command("benchmarks.fuse_ceiling", *args),
                                            stdout=sink, stderr=sink, env=child_environment())
        wait_for_mount(mountpoint, self.process, timeout_s=START_TIMEOUT_S,
                       describe=lambda: log.read_text(errors="replace")[-2000:])

    def close(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
