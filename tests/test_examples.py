"""The example pipeline (what ``./dev.sh demo`` runs) works end to end: producers through
fsspec and the mount, the streaming per-minute job, offload to S3 and the batch job over
the offloaded history; it checks its own figures and exits 1 on any difference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime (./dev.sh test installs one)")
def test_the_example_pipeline_runs_and_checks_out(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "pipeline.py"), str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "OK: streaming results and the batch over S3 both match" in done.stdout
    assert "the daemon fetched 0 blocks" in done.stdout  # executors read S3 themselves
    if Path("/dev/fuse").exists():
        assert "mounted at" in done.stdout


def test_a_failing_pipeline_stops_what_it_started(tmp_path: Path) -> None:
    """Spark cannot start (no Java where JAVA_HOME points): the pipeline fails, and its
    mount (or daemon) is gone when it exits."""
    work = tmp_path / "work"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "pipeline.py"), str(work)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert str(work / "mnt") not in Path("/proc/mounts").read_text()
    leftovers = [cmdline for cmdline in _command_lines() if str(work) in cmdline]
    assert leftovers == [], leftovers


def _command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:  # gone meanwhile
                continue
    return lines
