"""``python -m benchmarks peers`` runs end to end on tierfs's column at tiny sizes (so the
benchmark cannot rot): a real s3rver behind the counting proxy, a real tierfs mount
with S3 as tier-2, every operation of the table; and the two small-file floors (real
pyfuse3 mounts). No peer is installed or mounted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tierfs.testing.harness import disk_scratch_dir

REPO = Path(__file__).resolve().parent.parent
SIZE_MIB, SMALL_FILES, APPENDS = 2, 40, 30
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="the benchmark mounts tierfs: needs /dev/fuse")


def test_the_peer_benchmark_measures_every_row_of_tierfs() -> None:
    # a short scratch path: the mount daemon's Unix socket lives below it (108 bytes at most)
    parent = disk_scratch_dir("pb-")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks", "peers", "--systems", "tierfs,pyfuse3-floor,pyfuse3-pd-floor",
             "--size-mib", str(SIZE_MIB),
             "--small-files", str(SMALL_FILES), "--appends", str(APPENDS), "--random-reads", "10",
             "--tail-lines", "3", "--keep-page-cache", "--json", "--dir", str(parent)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert list(parent.iterdir()) == []  # the scratch directory is gone
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    figures = json.loads(done.stdout)
    tierfs = figures["systems"]["tierfs"]
    cells = tierfs["cells"]
    # every row is a figure, none an error (an ls that lists too few files is one)
    assert {row["key"] for row in figures["rows"]} == set(cells)
    for key, cell in cells.items():
        assert cell["error"] == "" and cell["value"] is not None, (key, cell)
    assert cells["cold_read"]["value"] > 0 and cells["appends"]["value"] > 0 and cells["create"]["value"] > 0
    # the counting proxy saw the cold read come from S3, and every appended byte go to it
    cold = tierfs["traffic"]["cold_read"]["GET"]
    assert cold["bytes_down"] >= SIZE_MIB * MiB, cold
    assert cells["append_up"]["value"] >= APPENDS * 4096 / MiB
    assert 0 <= cells["fsync_s3"]["value"] <= APPENDS * 4096 / MiB
    assert "durability pd" in tierfs["fsync_mechanism"]
    # the table: no peer, so no ratio; the page cache was left alone as asked
    assert "cold sequential read, 2 MiB" in done.stderr
    assert "not dropped: --keep-page-cache" in done.stderr
    assert all(row["ratio_tierfs_best_peer"] is None for row in figures["rows"])
    # the CPU per file is read from /proc in clock ticks (10 ms): for a few dozen files it
    # may round to 0, but it is always a measured figure
    assert cells["create_cpu"]["value"] >= 0 and cells["create_cpu"]["measured"]
    # the floors create the small files (the pd floor with its SQLite commit and fdatasync
    # per file) and measure nothing else; the bound needs a peer, so it says so
    for floor in ("pyfuse3-floor", "pyfuse3-pd-floor"):
        floor_cells = figures["systems"][floor]["cells"]
        assert floor_cells["create"]["value"] > 0, floor_cells
        assert floor_cells["create_cpu"]["value"] >= 0 and floor_cells["create_cpu"]["error"] == "", floor_cells
        assert floor_cells["cold_read"]["measured"] is False
    assert "small files, the bound: not measured (needs pyfuse3-pd-floor and a peer" in done.stderr
