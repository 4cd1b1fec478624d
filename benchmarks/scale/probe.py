"""The child side of ``benchmarks scale``: one fresh process per measurement, so that open
time and peak RSS (VmHWM) belong to that measurement alone; it prints one JSON object.

    python -m benchmarks.scale.probe first-open DATA_DIR
    python -m benchmarks.scale.probe namespace DATA_DIR NAMES_FILE
    python -m benchmarks.scale.probe chunks DATA_DIR SEGMENT
    python -m benchmarks.scale.probe fill-journal DATA_DIR MIB APPEND_BYTES
    python -m benchmarks.scale.probe recover DATA_DIR
"""

from __future__ import annotations

import functools
import json
import os
import random
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.harness.figures import Latency, MiB
from benchmarks.harness.procfs import memory_bytes

STAT_SAMPLES = 2000
NO_FLUSH = {"flush_interval_s": 3600.0, "flush_bytes": 4096 * MiB, "max_backlog_bytes": 4096 * MiB}


async def timed(call: Callable[[], Awaitable[Any]], times: int = 1) -> list[float]:
    found = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        found.append(time.perf_counter() - started)
    return found


async def namespace(data_dir: Path, names: list[str]) -> dict[str, Any]:
    """Open (a restart), stat of 2,000 names twice (from the metadata, then from memory),
    ``ls`` of ``small`` and of ``big``, the backups taken; the floor: the same lookups as
    bare SQLite queries."""
    from tierfs import StoreConfig, open_store

    sample = random.Random(8).sample(names, min(STAT_SAMPLES, len(names)))
    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        open_s, after_open = time.perf_counter() - started, memory_bytes()
        cold = [s for name in sample for s in await timed(functools.partial(store.stat, name))]
        warm = [s for name in sample for s in await timed(functools.partial(store.stat, name))]
        small = await timed(lambda: store.list("small"), 50)
        big_entries = len(await store.list("big"))
        big_s = (await timed(lambda: store.list("big")))[0]
        assert store.metadata_backup is not None
        backups = store.metadata_backup.backups_taken  # 0: the open found its backup current
    db = sqlite3.connect(data_dir / "metadata.sqlite")
    floor = []
    for name in sample:
        started = time.perf_counter()
        db.execute("SELECT id, name, rev, value FROM segments WHERE name=?", (name,)).fetchone()
        floor.append(time.perf_counter() - started)
    db.close()
    return {"open_s": open_s, "rss_after_open_bytes": after_open["VmRSS"], "peak_bytes": memory_bytes()["VmHWM"],
            "stat_cold": Latency.of(cold), "stat_warm": Latency.of(warm), "stat_floor": Latency.of(floor),
            "ls_small": Latency.of(small), "ls_big_entries": big_entries, "ls_big_s": big_s,
            "backups_while_probing": backups}


async def first_open(data_dir: Path) -> dict[str, Any]:
    """The filled store's first open and clean close: it takes the first metadata backup
    and leaves the seal a store grown by its own daemon has, so the probes after it time
    a restart."""
    from tierfs import StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        backup = store.metadata_backup
        assert backup is not None
        await backup.cycle()
    return {"first_open_close_s": time.perf_counter() - started, "first_backups": backup.backups_taken,
            "sealed": (data_dir / "metadata.backup-seal").exists()}


async def chunks(data_dir: Path, segment: str) -> dict[str, Any]:
    from tierfs import SegmentInfo, StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        open_s = time.perf_counter() - started
        info = await store.stat(segment)
        assert isinstance(info, SegmentInfo)
        first_read_s = (await timed(lambda: store.read(segment, 0, 4096)))[0]  # loads the chunk list, once
        rng = random.Random(3)
        reads = [s for _ in range(300) for s in await timed(
            functools.partial(store.read, segment, rng.randrange(0, info.length - 4096), 4096))]
        stats = await timed(lambda: store.stat(segment), 300)
    return {"open_s": open_s, "first_read_s": first_read_s, "read": Latency.of(reads), "stat": Latency.of(stats),
            "peak_bytes": memory_bytes()["VmHWM"]}


async def fill_journal(data_dir: Path, mib: int, append_bytes: int) -> None:
    """Unflushed appends, then exit without closing: what a crash leaves."""
    from tierfs import StoreConfig, open_store

    async with open_store(StoreConfig(data_dir=data_dir, **NO_FLUSH)) as store:  # type: ignore[arg-type]
        await store.create("journal/big", durability="vd", make_parents=True)
        data = os.urandom(append_bytes)
        for _ in range(mib * MiB // append_bytes):
            await store.append("journal/big", data)
        await store.sync("journal/big")
        print(json.dumps({"appended_bytes": mib * MiB}), flush=True)
        os._exit(0)


async def recover(data_dir: Path) -> None:
    """Open the crashed store (journal replay) and exit without closing: open time, peak RSS."""
    from tierfs import SegmentInfo, StoreConfig, open_store

    config = StoreConfig(data_dir=data_dir, **NO_FLUSH)  # type: ignore[arg-type]
    started = time.perf_counter()
    async with open_store(config) as store:
        open_s = time.perf_counter() - started
        info = await store.stat("journal/big")
        assert isinstance(info, SegmentInfo)
        print(json.dumps({"open_s": open_s, "length": info.length, "peak_bytes": memory_bytes()["VmHWM"],
                          "tail_memory_bytes": config.tail_memory_bytes}), flush=True)
        os._exit(0)


def main(argv: list[str]) -> int:
    from benchmarks.harness.scenario import as_json

    mode, data_dir = argv[0], Path(argv[1])
    if mode == "fill-journal":
        trio.run(fill_journal, data_dir, int(argv[2]), int(argv[3]))
    elif mode == "recover":
        trio.run(recover, data_dir)
    probes = {"namespace": lambda: namespace(data_dir, Path(argv[2]).read_text().split("\n")),
              "first-open": lambda: first_open(data_dir), "chunks": lambda: chunks(data_dir, argv[2])}
    print(json.dumps(trio.run(probes[mode]), default=as_json), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
