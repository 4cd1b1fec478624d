"""Helpers shared by test modules (imported as ``helpers``; tests/ is not a package so
the repository root, which holds a folder named ``fuse``, never lands on sys.path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tierfs import StoreConfig

KiB = 1 << 10


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


class Daemon:
    """A real ``tierfs serve`` process on a data dir (started by ``start_daemon``)."""

    def __init__(self, data_dir: Path, proc: subprocess.Popen[bytes]) -> None:
        self.data_dir = data_dir
        self.proc = proc
        self.socket = data_dir / "tierfs.sock"

    def client(self):  # type: ignore[no-untyped-def]
        from tierfs.remote.client import TierClient

        return TierClient(f"unix://{self.socket}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        _, stderr = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, stderr.decode(errors="replace")


def start_daemon(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "-v", "serve", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
    )
    daemon = Daemon(data_dir, proc)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited: {proc.communicate()[1].decode()[-2000:]}")
        if daemon.socket.exists():
            try:
                daemon.client().health()
                return daemon
            except Exception:
                pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("daemon did not start")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mount:
    """A real ``tierfs mount --foreground`` process: the daemon serving a FUSE mount."""

    def __init__(self, data_dir: Path, mountpoint: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.mountpoint = mountpoint
        self.socket = data_dir / "tierfs.sock"
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "-v",
             "mount", str(mountpoint), "--foreground", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 30
        while not (os.path.isdir(mountpoint) and os.path.ismount(mountpoint) and self.socket.exists()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"mount exited: {self.proc.communicate()[1].decode()[-2000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("the mount did not come up")
            time.sleep(0.05)

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def client(self):  # type: ignore[no-untyped-def]
        from tierfs.remote.client import TierClient

        return TierClient(f"unix://{self.socket}")

    def unmount(self, timeout_s: float = 30) -> tuple[int, str]:
        """``tierfs umount``; returns the daemon's exit code and stderr."""
        from tierfs.fuse.mount import is_mount_point

        if is_mount_point(self.mountpoint):
            subprocess.run([sys.executable, "-m", "tierfs.cli", "umount", str(self.mountpoint)],
                           check=True, capture_output=True)
        _, stderr = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, stderr.decode(errors="replace")

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)
