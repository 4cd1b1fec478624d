"""How often the metadata backup uploads (issue 19, item 6): every change within the
relaxed interval, a change a tier2 append waits on within the short one, and never
more than COST_SPACING times a cycle's duration after it (the bound on what a restore
may lose and on what backups cost)."""

from __future__ import annotations

import time
from pathlib import Path

import trio
from trio.testing import MockClock

from tierfs import open_store
from tierfs.engine.backup_objects import BackupObjects
from tierfs.engine.metadata_backup import COST_SPACING, MetadataBackup
from tierfs.testing.harness import small_config


def _scheduled_backup(tmp_path: Path, cycle_s: float) -> tuple[MetadataBackup, list[float]]:
    """A backup whose cycles take ``cycle_s`` of trio time, upload every time and
    record when they started (the schedule alone is under test)."""
    backup = MetadataBackup(tmp_path / "metadata.sqlite", BackupObjects(str(tmp_path / "t2")), 1,
                            interval_s=1.0, relaxed_interval_s=10.0)
    starts: list[float] = []

    async def cycle(timeout_s: float = 0.0) -> bool:
        starts.append(trio.current_time())
        await trio.sleep(cycle_s)
        return True

    backup.cycle = cycle  # type: ignore[method-assign]
    return backup, starts


async def test_changes_wait_the_relaxed_interval_unless_a_tier2_commit_asks(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    backup, starts = _scheduled_backup(tmp_path, cycle_s=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backup.run)
        await trio.sleep(25.0)
        assert [round(s) for s in starts] == [0, 10, 20]  # plain changes: every 10 s
        backup.request_soon()  # at 25 s, long after the last cycle: at once
        await trio.sleep(0.5)
        assert round(starts[-1], 1) == 25.0
        backup.request_soon()  # right after a cycle: not before the short interval
        await trio.sleep(2.0)
        assert len(starts) == 5 and 26.0 <= starts[-1] < 26.2
        nursery.cancel_scope.cancel()


async def test_an_expensive_cycle_spaces_the_next_ones(tmp_path: Path, autojump_clock: MockClock) -> None:
    backup, starts = _scheduled_backup(tmp_path, cycle_s=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backup.run)
        await trio.sleep(1.0)
        backup.request_soon()  # even a tier2 commit waits for the spacing
        await trio.sleep(70.0)
        nursery.cancel_scope.cancel()
    scheduled = starts[:-1]  # the last one is the shutdown cycle, run when cancelled
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:], strict=False)]
    assert len(gaps) == 2 and all(abs(gap - (3.0 + COST_SPACING * 3.0)) < 0.01 for gap in gaps)  # busy 10 % of the time


async def test_a_tier2_append_is_backed_up_within_the_short_interval(tmp_path: Path) -> None:
    # flush interval 1 s: tier2 commits are backed up within 1 s, anything else 10 s
    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "t2"), flush_interval_s=1.0)
    async with open_store(config) as store:
        backup = store.metadata_backup
        assert backup is not None and backup.relaxed_interval_s == 10.0 and backup.interval_s == 1.0
        await store.create("t2", durability="tier2")
        with trio.fail_after(30):  # the start-up cycle and one for the create, then quiet
            while backup.backups_taken < 1:
                await trio.sleep(0.05)
        await trio.sleep(1.5)
        taken = backup.backups_taken
        appended = time.monotonic()
        await store.append("t2", b"acknowledged once in tier-2")  # returns once committed
        with trio.fail_after(8):  # well before the relaxed 10 s
            while backup.backups_taken == taken:
                await trio.sleep(0.05)
        assert time.monotonic() - appended < 8
    snapshot = BackupObjects(str(tmp_path / "t2")).manifests()[0]
    assert snapshot.size_bytes > 0
