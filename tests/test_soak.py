"""The soak (tierfs/testing/soak.py): kill -9 cycles of a mount daemon under fsspec, CLI
and FUSE PD appenders; its checker must see every kind of damage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tierfs.testing.soak import SoakReport, check_segment, run_soak
from tierfs.testing.soak_writer import record

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="the soak's mount writer needs /dev/fuse and fusermount3 (apt install fuse3)",
)


def _assert_clean(report: SoakReport, cycles: int) -> None:
    assert report.failures == [] and report.clean, report
    assert report.cycles == cycles
    assert report.records >= report.acked > 0
    assert all(report.acked_by_kind.get(kind, 0) > 0 for kind in ("fsspec", "fuse")), report


@needs_fuse
def test_soak_three_kill_cycles(tmp_path: Path) -> None:
    _assert_clean(run_soak(tmp_path / "soak", 3), 3)


@needs_fuse
@pytest.mark.slow
def test_soak_hundred_kill_cycles(tmp_path: Path) -> None:
    report = run_soak(tmp_path / "soak", 100, seed=7)
    _assert_clean(report, 100)
    assert report.acked_by_kind.get("cli", 0) > 0


def test_the_checker_counts_every_kind_of_damage() -> None:
    a = [record("a", seq, "ab" * (seq + 1)) for seq in range(4)]
    b = [record("b", seq, "cd") for seq in range(3)]
    good = a[0] + b[0] + a[1] + b[1] + a[2] + b[2] + a[3]
    report = SoakReport()
    check_segment(good, {"a": 4, "b": 3}, report)
    assert report.clean and report.records == 7 and report.failures == []

    damaged = a[0] + a[2] + a[1] + a[1][:-1] + b"0\n" + b[0] + b[0] + b[2][:5]
    report = SoakReport()
    check_segment(damaged, {"a": 4, "b": 3}, report)
    # a[1] flipped, the tail cut; a3, b1, b2 missing (the cut b2 does not count)
    assert (report.torn, report.duplicated, report.out_of_order, report.lost) == (2, 1, 1, 3)
    assert not report.clean
