"""``python -m benchmarks cluster`` runs end to end at tiny sizes (so it cannot rot): a
durable PostgreSQL next to SQLite, two filled stores, and every section on real cluster
daemons (forwarded appends included)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_cluster_benchmark_runs() -> None:
    # a short scratch path: the daemons' Unix sockets live below it (108 bytes at most)
    tmp_path = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))
    try:
        _run_in(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_in(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "cluster", "--rounds", "5", "--small", "200", "--large", "1000",
         "--large-dir", "300", "--writers", "1", "--seconds", "0.5", "--failovers", "1", "--lease", "1", "--tail-lines", "20",
         "--many-containers", "8", "--group-writers", "2", "--group-runs", "1", "--forward-writers", "2",
         "--forward-runs", "1",
         "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("flush commit", "bound: smallest commit", "small: 200 segments", "large: 1,000 segments",
                 "ls of 300", "large/small (5x segments)", "3 daemons", "the single-host daemon",
                 "failover (kill -9", "1 runs, lease 1 s", "tail -f latency", "20 lines",
                 "PostgreSQL connections, 8 containers on 3 daemons", "bound 10 each",
                 "group commit, 1 KiB PD appends by 2 writers on one daemon", "group commit: 2 containers / one",
                 "forwarded appends, 1 KiB PD", "through the owner", "2 writers, one segment", "2 writers, 2 segments",
                 "forwarded / owner, 1 writer (worst of 1)", "daemons' CPU-s per 1,000"):
        assert line in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
