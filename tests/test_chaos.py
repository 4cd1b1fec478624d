"""The randomized fault-and-feature harness (``tierfs.testing.chaos``) on real daemons:
every fault of the data-safety issue strikes in turn on one host (tier-2 on moto's S3
behind the fault proxy, the data dir on the power-loss layer), a seed mixes them, and
three hosts on a real PostgreSQL lose an owner to a pause, the database and a kill -9;
every acknowledged append is checked against its durability level's promise after every
step. ``pytest -m slow`` runs 100 seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfs.testing.chaos.cluster_run import CLUSTER_NEMESES, run_cluster
from tierfs.testing.chaos.nemeses import NEMESES
from tierfs.testing.chaos.runner import RunResult, run


def _no_problems(result: RunResult) -> None:
    assert not result.problems, "\n".join([*result.problems, f"replay: {result.replay}"])
    assert result.summary["acknowledged"] > 0


def test_every_fault_in_turn_on_one_host(tmp_path: Path) -> None:
    result = run(11, len(NEMESES), tmp_path, nemeses=list(NEMESES), s3=True, in_turn=True, log=lambda line: None)
    _no_problems(result)
    assert result.nemeses == list(NEMESES)


def test_a_seed_mixes_the_faults(tmp_path: Path) -> None:
    _no_problems(run(1, 4, tmp_path, log=lambda line: None))


def test_three_hosts_lose_an_owner_to_a_pause_the_database_a_kill_and_a_drain(
        postgres_server: object, tmp_path: Path) -> None:
    del postgres_server  # proves PostgreSQL is installed; the run starts its own
    result = run_cluster(1, len(CLUSTER_NEMESES), tmp_path, nemeses=list(CLUSTER_NEMESES), in_turn=True,
                         log=lambda line: None)
    _no_problems(result)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 200))
def test_hundred_seeds(seed: int, tmp_path: Path) -> None:
    if seed % 5 == 0:
        _no_problems(run_cluster(seed, 5, tmp_path, log=lambda line: None))
    else:
        _no_problems(run(seed, 10, tmp_path, s3=seed % 5 == 1, log=lambda line: None))


def test_the_ledger_finds_a_record_right_after_a_torn_one() -> None:
    """A lost host's last flush may end inside a record (forgiven: acknowledged after the
    flush was asked for); the record appended after the restore follows it directly."""
    from tierfs.testing.chaos.ledger import parse_lines, record_line

    torn, after, next_one = (record_line("run", "w3", seq, 40) for seq in (1103, 1116, 1117))
    assert list(parse_lines(torn[:25] + after + next_one)) == [after, next_one]
