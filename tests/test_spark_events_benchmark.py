"""``python -m benchmarks spark --scenario events`` runs end to end at a tiny size (so it
cannot rot): every reader agrees on the totals (the benchmark refuses to report
otherwise), every target is checked, and every read job's CPU and the bounds it sets
are printed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tierfs.testing.harness import disk_scratch_dir

REPO = Path(__file__).resolve().parent.parent


def test_the_spark_events_benchmark_runs_and_prints_its_bounds() -> None:
    tmp_path = disk_scratch_dir("se-")  # short: the daemon's socket lives below it
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks", "spark", "--scenario", "events", "--size-mib", "1",
             "--partition-mib", "1", "--rounds", "1", "--dir", str(tmp_path), "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)
        checked = {check["name"] for check in report["checks"]}
        for master in ("local[1]", "local[2]"):
            assert {f"(j)/(J) {master}", f"(l)/(T) {master}", f"(w)/(W) {master}, rows/s"} <= checked
        bounds = "\n".join(report["bounds"])
        for line in ("read jobs, CPU per MiB of events", "round 1 local[1] (j): JVM",
                     "bound on (j)/(J) local[2]:", "cores running its CPU", "one worker thread per slot",
                     "bound on (l) local[2]/local[1]", "bound on (w)/(W) local[1]"):
            assert line in bounds, bounds
        assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
