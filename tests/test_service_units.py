"""The systemd units in examples/systemd/ (docs/operations.md#as-a-service): installed as
their own comment says, ``systemd-analyze verify`` finds nothing to say about them, and
the command each one starts serves (or mounts) and, on the unit's ``KillSignal``, stops
cleanly (exit 0, unmounted) well within ``TimeoutStopSec``."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierfs.remote.client import TierClient
from tierfs.testing.harness import START_TIMEOUT_S, wait_for_mount

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "examples" / "systemd"
UNIT_NAMES = ("tierfs.service", "tierfs-mount.service")
VENV_BIN = Path(sys.executable).parent


def _installed(name: str, target: Path) -> Path:
    """The unit as its ``# Install:`` line makes it, with the tierfs on PATH (the venv's)."""
    text = (UNITS / name).read_text()
    (command,) = re.findall(r"^# Install: (.+)$", text, re.M)
    command = command.replace(f"/etc/systemd/system/{name}", str(target / name))
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["bash", "-c", command], cwd=UNITS, env=env, check=True)
    return target / name


def _service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(unit)
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="./dev.sh test installs systemd-analyze")
@pytest.mark.parametrize("name", UNIT_NAMES)
def test_the_unit_verifies_without_a_word(name: str, tmp_path: Path) -> None:
    unit = _installed(name, tmp_path)
    assert str(VENV_BIN / "tierfs") in unit.read_text()
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stdout + done.stderr


def _command(unit: Path, data_dir: Path, mountpoint: Path) -> list[str]:
    words = shlex.split(_service(unit)["ExecStart"])
    return [w.replace("/var/lib/tierfs", str(data_dir)).replace("/mnt/tierfs", str(mountpoint)) for w in words]


def _stops_on_its_kill_signal(unit: Path, proc: subprocess.Popen[bytes]) -> None:
    service = _service(unit)
    kill_signal = getattr(signal, service["KillSignal"])
    timeout_s = float(service["TimeoutStopSec"])
    proc.send_signal(kill_signal)
    assert proc.wait(timeout=timeout_s / 2) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


def test_the_serve_unit_serves_and_stops_on_its_kill_signal(tmp_path: Path) -> None:
    unit = _installed("tierfs.service", tmp_path)
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(_command(unit, data_dir, tmp_path / "unused"), stderr=subprocess.PIPE)
    try:
        socket = data_dir / "tierfs.sock"
        deadline_s = time.monotonic() + START_TIMEOUT_S  # a failure bound only
        while True:  # it answers once it serves, or exits
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline_s, "the unit's daemon did not serve"
            if socket.exists():
                client = TierClient(f"unix://{socket}")
                try:
                    client.health()
                    break
                except Exception:  # noqa: BLE001 - mid-start
                    pass
                finally:
                    client.close()
            time.sleep(0.05)
        _stops_on_its_kill_signal(unit, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="the mount unit mounts: needs /dev/fuse and fusermount3")
@pytest.mark.skipif(os.getuid() != 0, reason="the mount unit runs as root (--allow-other)")
def test_the_mount_unit_mounts_and_unmounts_on_its_kill_signal(tmp_path: Path) -> None:
    unit = _installed("tierfs-mount.service", tmp_path)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()  # the unit's ExecStartPre
    proc = subprocess.Popen(_command(unit, tmp_path / "data", mountpoint), stderr=subprocess.PIPE)
    try:
        wait_for_mount(mountpoint, proc)
        _stops_on_its_kill_signal(unit, proc)
        assert not os.path.ismount(mountpoint)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.ismount(mountpoint):
            subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
