"""fsck beside live traffic: appends, flushes, chunk roll-over, deletes and re-creates
run while fsck loops, and no report may show damage (every one of them is false)."""

from __future__ import annotations

import trio

from tierfs.store.facade import SegmentStore
from tierfs.store.fsck import fsck

SEGMENTS = 4
FSCK_ROUNDS = 25


async def test_fsck_while_flushes_run_reports_no_false_damage(store: SegmentStore) -> None:
    for index in range(SEGMENTS):
        await store.create(f"s{index}")
    reports = []

    async def writer(name: str, stop: trio.Event) -> None:
        piece = name.encode() * 4000  # several appends per flush, chunks roll over
        while not stop.is_set():
            await store.append(name, piece)
            await trio.sleep(0.002)

    async def churner(stop: trio.Event) -> None:
        rounds = 0
        while not stop.is_set():
            await store.create("churn")
            await store.append("churn", b"c" * 100_000)
            await store.flush("churn")
            await store.delete("churn")
            rounds += 1

    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        for index in range(SEGMENTS):
            nursery.start_soon(writer, f"s{index}", stop)
        nursery.start_soon(churner, stop)
        for _ in range(FSCK_ROUNDS):
            reports.append(await fsck(store))
            await trio.sleep(0.01)
        stop.set()
    assert [p for r in reports for p in r.problems] == []
    assert sum(r.chunks for r in reports) > FSCK_ROUNDS * SEGMENTS  # it did look at chunks
    await store.flush()
    final = await fsck(store)
    assert final.problems == [] and final.segments == SEGMENTS
