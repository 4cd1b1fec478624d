"""What a chaos run runs on: real daemons, real tier-2 and the layers faults go through.

- ``Host``: one ``tierfs serve`` on a data dir (``start``, ``kill9``, ``stop``), its
  TOML settings, a client; the data dir on the power-loss layer (``LazyLayer``:
  ``tierfs.testing.faults.lazyfs``) when asked; tier-2 a local directory or S3.
- ``S3Tier2``: moto's S3 server on 127.0.0.1, behind the fault-injecting proxy
  (``tierfs.testing.faults.fault_proxy``), with a bucket of the run's own.

Invariant: everything started here is stopped by ``close`` (daemons, mounts, servers),
also after a failure, so a run leaves no process or mount behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tierfs.testing.harness import Daemon, HarnessError, free_port, processes, start_daemon

START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 30.0


class LazyLayer:
    """``tierfs.testing.faults.lazyfs`` serving ``backing`` at ``mountpoint``."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.full = False
        self.proc = subprocess.Popen([sys.executable, "-m", "tierfs.testing.faults.lazyfs", str(self.backing),
                                      str(self.mountpoint)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            error = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise HarnessError(f"lazyfs did not start: {line!r} {error}")

    def power_cut(self) -> None:
        """Every unsynced write is dropped; the layer comes back with what was synced."""
        self._end(signal.SIGUSR1)
        self.start()

    def set_full(self, full: bool) -> None:
        """The disk under the layer is full (or has space again) once this returns."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        if full == self.full:
            return
        proc.send_signal(signal.SIGUSR2)
        line = proc.stdout.readline().strip()
        if line != (b"full" if full else b"space"):
            raise HarnessError(f"lazyfs answered {line!r} to a disk-full toggle")
        self.full = full

    def close(self) -> None:
        self._end(signal.SIGTERM)

    def _end(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)


class S3Tier2:
    """moto's S3 server behind the fault proxy, and a bucket (see the module docstring)."""

    def __init__(self, root: Path, seed: int) -> None:
        import boto3

        from tierfs.testing.faults.fault_proxy import FaultProxy

        self.port = free_port()
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        self.server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise HarnessError("moto's S3 server did not start") from None
                time.sleep(0.1)
        self.proxy = FaultProxy(f"http://127.0.0.1:{self.port}", seed=seed)
        self.proxy.__enter__()
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket="chaos")
        self.url = "s3://chaos/tier2"

    def settings(self) -> list[str]:
        return [f'tier2_url = "{self.url}"', "[tier2_options]", f'endpoint_url = "{self.proxy.url}"',
                'key = "testing"', 'secret = "testing"']

    def close(self) -> None:
        proxy = getattr(self, "proxy", None)
        if proxy is not None:
            proxy.__exit__(None, None, None)
        if self.server.poll() is None:
            self.server.terminate()
            self.server.wait(timeout=30)


class Host:
    """One daemon and its data dir (see the module docstring)."""

    def __init__(self, root: Path, tier2: str | S3Tier2, *, lazy: bool, settings: dict[str, Any]) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.lazy = LazyLayer(root / "backing", root / "lazy") if lazy else None
        self.data_dir = (root / "lazy" if lazy else root) / "data"
        self.tier2 = tier2
        lines = [f"{key} = {value!r}".replace("'", '"') for key, value in settings.items()]
        if isinstance(tier2, S3Tier2):
            lines = lines + tier2.settings()
        else:
            lines.insert(0, f'tier2_url = "{tier2}"')
        self.config = root / "tierfs.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.daemon: Daemon | None = None
        self.starts = 0  # each daemon's stderr goes to root/daemon.N.log, for whoever reads a failure

    @property
    def socket(self) -> Path:
        return self.data_dir / "tierfs.sock"

    def start(self, *args: str) -> Daemon:
        """The daemon, once serving; while a writer's ``tierfs append`` has the data dir
        open in-process (the daemon was down), the start waits for it, as a user would."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.starts += 1
                self.daemon = start_daemon(self.data_dir, *args, config_file=self.config, timeout_s=START_TIMEOUT_S,
                                           log_path=self.root / f"daemon.{self.starts}.log")
                return self.daemon
            except HarnessError as e:
                if "(in_use)" not in str(e) and "is in use by" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.daemon is not None and self.daemon.proc.poll() is None

    def kill9(self) -> None:
        if self.daemon is not None and self.daemon.proc.poll() is None:
            self.daemon.kill9()

    def kill_every_user(self) -> int:
        """SIGKILL every process working on the data dir (the daemon, and ``tierfs
        append`` runs that opened it in-process while the daemon was down), as a power
        loss stops them all; how many besides the daemon."""
        self.kill9()
        mine = os.fsencode(str(self.data_dir))
        killed = 0
        for pid, _, command in processes():
            if b"tierfs.cli" in command and mine in command:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        return killed

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.proc.poll() is None:
            self.daemon.stop()

    def cli(self, *args: str, data_dir: Path | None = None, timeout_s: float = 120.0,
            stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """``tierfs ARGS`` on this host's data dir (or ``data_dir``), with its settings."""
        argv = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir or self.data_dir),
                "--config", str(self.config), *args]
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
        return subprocess.run(argv, capture_output=True, timeout=timeout_s, input=stdin, env=env)

    def lost_found_bytes(self, *data_dirs: Path) -> bytes:
        """Every byte under the lost+found of this host's data dir (and of ``data_dirs``)."""
        found = bytearray()
        for data_dir in (self.data_dir, *data_dirs):
            for path in sorted((data_dir / "lost+found").rglob("*")) if (data_dir / "lost+found").is_dir() else []:
                if path.is_file() and not path.name.endswith(".json"):
                    found += path.read_bytes()
        return bytes(found)

    def close(self) -> None:
        with contextlib.suppress(HarnessError, OSError):
            self.stop()
        with contextlib.suppress(HarnessError, OSError):
            self.kill9()
        if self.lazy is not None:
            self.lazy.close()

    def remove_data_dir(self) -> None:
        """The host's disk is gone (the power-loss layer's backing files too)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)
