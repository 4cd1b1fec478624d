"""How often the metadata reaches tier-2: every change within a flush interval (the
change log, shipped), a whole snapshot every relaxed interval and never more than
COST_SPACING times a cycle's duration after the last, and a tier2 append acknowledged
only once its commit is shipped (the bounds on what a restore may lose and on what
backups cost)."""

from __future__ import annotations

from pathlib import Path

import trio
from trio.testing import MockClock

from tierfs import open_store
from tierfs.engine.backup.metadata_backup import COST_SPACING, MetadataBackup
from tierfs.engine.backup.objects import BackupObjects
from tierfs.testing.harness import small_config


def _scheduled_backup(tmp_path: Path, cycle_s: float) -> tuple[MetadataBackup, list[float], list[float]]:
    """A backup whose cycles take ``cycle_s`` of trio time, upload every time and
    record when they started, and whose shipments record when they ran (the schedule
    alone is under test)."""
    backup = MetadataBackup(tmp_path / "metadata.sqlite", BackupObjects(str(tmp_path / "t2")), 1,
                            interval_s=1.0, relaxed_interval_s=10.0)
    starts: list[float] = []
    shipments: list[float] = []

    async def cycle(timeout_s: float = 0.0) -> bool:
        starts.append(trio.current_time())
        await trio.sleep(cycle_s)
        return True

    async def ship_once() -> None:
        shipments.append(trio.current_time())
        await trio.sleep(0)

    backup.cycle = cycle  # type: ignore[method-assign]
    backup._ship_once = ship_once  # type: ignore[method-assign]
    return backup, starts, shipments


async def test_changes_ship_every_interval_and_snapshots_come_every_relaxed_one(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    backup, starts, shipments = _scheduled_backup(tmp_path, cycle_s=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backup.run)
        await trio.sleep(25.0)
        nursery.cancel_scope.cancel()
    assert [round(s) for s in starts[:-1]] == [0, 10, 20]  # the last: the shutdown cycle
    gaps = [b - a for a, b in zip(shipments, shipments[1:], strict=False)][:-1]
    assert len(gaps) >= 20 and all(gap <= 1.02 for gap in gaps)


async def test_an_expensive_cycle_spaces_the_next_ones(tmp_path: Path, autojump_clock: MockClock) -> None:
    backup, starts, _ = _scheduled_backup(tmp_path, cycle_s=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backup.run)
        await trio.sleep(71.0)
        nursery.cancel_scope.cancel()
    scheduled = starts[:-1]  # the last one is the shutdown cycle, run when cancelled
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:], strict=False)]
    assert len(gaps) == 2 and all(abs(gap - (3.0 + COST_SPACING * 3.0)) < 1.1 for gap in gaps)  # busy ~10 %


async def test_a_tier2_append_is_acknowledged_once_its_commit_is_shipped(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "t2"), flush_interval_s=3600.0)
    async with open_store(config) as store:
        backup = store.metadata_backup
        assert backup is not None
        await store.create("t2", durability="tier2")
        shipped = backup.shipments
        await store.append("t2", b"acknowledged once in tier-2")  # returns once committed and shipped
        assert backup.shipments > shipped
        logs = BackupObjects(str(tmp_path / "t2")).logs()
        assert logs and logs[-1].last == backup.shipped_seq
