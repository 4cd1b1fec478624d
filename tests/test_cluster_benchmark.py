"""``python -m benchmarks cluster`` runs end to end at tiny sizes (so it cannot rot): a
durable PostgreSQL next to SQLite, and two filled stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_cluster_benchmark_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "cluster", "--rounds", "5", "--small", "200", "--large", "1000",
         "--large-dir", "300", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("flush commit", "bound: smallest commit", "small: 200 segments", "large: 1,000 segments",
                 "ls of 300", "large/small (5x segments)"):
        assert line in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
