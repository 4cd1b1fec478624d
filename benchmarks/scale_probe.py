"""The child side of ``benchmarks scale``: one fresh process per measurement, so that
open time and peak RSS (VmHWM) belong to that measurement alone. Prints one JSON
object on stdout.

    python -m benchmarks.scale_probe first-open DATA_DIR
    python -m benchmarks.scale_probe namespace DATA_DIR NAMES_FILE BIG_DIR
    python -m benchmarks.scale_probe chunks DATA_DIR SEGMENT
    python -m benchmarks.scale_probe fill-journal DATA_DIR MIB APPEND_BYTES
    python -m benchmarks.scale_probe recover DATA_DIR
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import Latency
from tierfs.contracts.info import SegmentInfo

MiB = 1 << 20
STAT_SAMPLES = 2000
NO_FLUSH = {"flush_interval_s": 3600.0, "flush_bytes": 4096 * MiB, "max_backlog_bytes": 4096 * MiB}


def memory_kib() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, KiB."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found


def _timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


async def namespace(data_dir: Path, names: list[str], big_dir: str) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    sample = random.Random(8).sample(names, min(STAT_SAMPLES, len(names)))
    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        open_s = time.perf_counter() - started
        after_open = memory_kib()
        cold: list[float] = []
        warm: list[float] = []
        for into in (cold, warm):
            for name in sample:
                t = time.perf_counter()
                await store.stat(name)
                into.append(time.perf_counter() - t)
        small = []
        for _ in range(50):
            t = time.perf_counter()
            assert len(await store.list("small")) == 10
            small.append(time.perf_counter() - t)
        t = time.perf_counter()
        big_entries = len(await store.list(big_dir))
        big_s = time.perf_counter() - t
        assert store.metadata_backup is not None
        backups = store.metadata_backup.backups_taken  # 0: the open found its backup current
    # the floor of a stat that misses memory: one indexed SQLite lookup, same names
    db = sqlite3.connect(data_dir / "metadata.sqlite")
    floor = [_timed(lambda n: db.execute("SELECT id, name, rev, value FROM segments WHERE name=?",
                                         (n,)).fetchone(), name) for name in sample]
    db.close()
    return {"open_s": open_s, "rss_after_open_kib": after_open["VmRSS"], "peak_kib": memory_kib()["VmHWM"],
            "stat_cold": Latency.of(cold).__dict__, "stat_warm": Latency.of(warm).__dict__,
            "stat_floor": Latency.of(floor).__dict__, "ls_small": Latency.of(small).__dict__,
            "ls_big_entries": big_entries, "ls_big_s": big_s, "backups_while_probing": backups}


async def first_open(data_dir: Path) -> dict[str, Any]:
    """The filled store's first open and clean close: it takes the store's first metadata
    backup and leaves the seal, as a store grown by its own daemon has, so the probes
    after it time a restart (``engine/backup/seal.py``)."""
    from tierfs import StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        backup = store.metadata_backup
        assert backup is not None
        await backup.cycle()
    return {"first_open_close_s": time.perf_counter() - started, "first_backups": backup.backups_taken,
            "sealed": (data_dir / "metadata.backup-seal").exists()}


async def chunks(data_dir: Path, segment: str) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        open_s = time.perf_counter() - started
        info = await store.stat(segment)
        assert isinstance(info, SegmentInfo)
        t = time.perf_counter()
        await store.read(segment, 0, 4096)  # loads the chunk list: O(chunks), once
        first_read_s = time.perf_counter() - t
        rng = random.Random(3)
        offsets = [rng.randrange(0, info.length - 4096) for _ in range(300)]
        reads = []
        for offset in offsets:
            t = time.perf_counter()
            await store.read(segment, offset, 4096)
            reads.append(time.perf_counter() - t)
        stats = []
        for _ in range(300):
            t = time.perf_counter()
            await store.stat(segment)
            stats.append(time.perf_counter() - t)
    return {"open_s": open_s, "first_read_s": first_read_s, "read": Latency.of(reads).__dict__,
            "stat": Latency.of(stats).__dict__, "peak_kib": memory_kib()["VmHWM"]}


async def fill_journal(data_dir: Path, mib: int, append_bytes: int) -> dict[str, Any]:
    """Unflushed appends, then exit without closing: what a crash leaves."""
    from tierfs import StoreConfig, open_store

    async with open_store(StoreConfig(data_dir=data_dir, **NO_FLUSH)) as store:  # type: ignore[arg-type]
        await store.create("journal/big", durability="vd", make_parents=True)
        data = os.urandom(append_bytes)
        for _ in range(mib * MiB // append_bytes):
            await store.append("journal/big", data)
        await store.sync("journal/big")
        sys.stdout.write(json.dumps({"appended_bytes": mib * MiB}) + "\n")
        sys.stdout.flush()
        os._exit(0)
    return {}


async def recover(data_dir: Path) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    config = StoreConfig(data_dir=data_dir, **NO_FLUSH)  # type: ignore[arg-type]
    started = time.perf_counter()
    async with open_store(config) as store:
        open_s = time.perf_counter() - started
        info = await store.stat("journal/big")
        assert isinstance(info, SegmentInfo)
        length = info.length
        peak = memory_kib()["VmHWM"]
        os._exit(_print({"open_s": open_s, "length": length, "peak_kib": peak,
                         "tail_memory_bytes": config.tail_memory_bytes}))
    return {}


def _print(result: dict[str, Any]) -> int:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    mode, data_dir = argv[0], Path(argv[1])
    if mode == "namespace":
        names = Path(argv[2]).read_text().split("\n")
        return _print(trio.run(namespace, data_dir, names, argv[3]))
    if mode == "first-open":
        return _print(trio.run(first_open, data_dir))
    if mode == "chunks":
        return _print(trio.run(chunks, data_dir, argv[2]))
    if mode == "fill-journal":
        trio.run(fill_journal, data_dir, int(argv[2]), int(argv[3]))
        return 0
    if mode == "recover":
        trio.run(recover, data_dir)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
