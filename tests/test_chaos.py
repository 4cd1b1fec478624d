"""The randomized fault-and-feature harness (``tierfs.testing.chaos``) on real daemons:
each named scenario strikes with one fault of the data-safety issue, a few seeds mix all
of them, and every acknowledged append is checked against its durability level's
promise after every step. ``pytest -m slow`` runs 100 seeds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tierfs.testing.chaos.nemeses import NEMESES
from tierfs.testing.chaos.runner import RunResult, run

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def _no_problems(result: RunResult) -> None:
    assert not result.problems, "\n".join([*result.problems, f"replay: {result.replay}"])


@pytest.mark.parametrize("nemesis", sorted(set(NEMESES) - {"s3_faults"}))
def test_each_fault_alone_keeps_every_acknowledged_append(nemesis: str, tmp_path: Path) -> None:
    result = run(11, 2, tmp_path, nemeses=[nemesis], log=lambda line: None)
    _no_problems(result)
    assert result.summary["acknowledged"] > 0


def test_s3_faults_keep_every_acknowledged_append(tmp_path: Path) -> None:
    result = run(12, 2, tmp_path, nemeses=["s3_faults", "kill9"], s3=True, log=lambda line: None)
    _no_problems(result)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_fault_mixed(seed: int, tmp_path: Path) -> None:
    result = run(seed, 6, tmp_path, nemeses=sorted(set(NEMESES) - {"s3_faults"}), log=lambda line: None)
    _no_problems(result)
    assert len(set(result.nemeses)) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 200))
def test_hundred_seeds(seed: int, tmp_path: Path) -> None:
    result = run(seed, 10, tmp_path, nemeses=list(NEMESES), s3=seed % 4 == 0, log=lambda line: None)
    _no_problems(result)
