"""Scale: what opening the store, ``stat``, ``ls`` and recovery cost as the store grows,
next to the floor of the same work (issue 19, item 6). Each measurement runs in a fresh
process (``python -m benchmarks.scale PROBE DATA_DIR ...``), so its open time and peak
RSS (VmHWM) are its own.

1. ``--segments`` (1k..1M) filled through the metadata, opened and closed once (the
   first backup and seal), then a restart: open time, RSS, ``stat`` of 2,000 names from
   the metadata, ``ls`` of ``small/`` and ``big/``; floor: bare SQLite queries.
2. ``--chunks`` (100..100k) per segment: 300 random 4 KiB reads after the first (which
   loads the chunk list); floor: ``pread`` of the same chunk files.
3. ``ls -l`` of ``--ls-entries`` (100k) on a fresh mount and again; ceiling: as many
   empty files on the scratch disk.
4. Recovery of ``--recover-mib`` (512) unflushed VD appends of 1 and 64 KiB after a
   crash: open time and peak RSS against ``tail_memory_bytes`` + 150 MiB.
5. A restart after a burst of ``--burst-creates`` (50,000) creates through the store (its
   journal holds every creation): the first open after the clean close, and a later
   open (the ceiling: nothing left to look at).

Targets (issue 19): open <= 0.3 s and stat p99 <= 150 µs at the largest store; ``ls -l``
on the mount <= 3 s; recovery peak RSS within its bound. Issue 37: the first open after
the burst <= 0.3 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from benchmarks.harness.child import run_once
from benchmarks.harness.figures import Check, Latency, MiB
from benchmarks.harness.mounts import mounted
from benchmarks.harness.procfs import memory_bytes
from benchmarks.harness.scenario import Report
from benchmarks.harness.stores import fill_segments
from tierfs import SegmentInfo, StoreConfig, open_store
from tierfs.blocks.checksums import block_crcs_of
from tierfs.engine import records
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.object_keys import chunk_name
from tierfs.engine.record_types import Chunk, DirectoryMeta, SegmentMeta

HELP = "store open, stat and ls from 1k to 1M segments, reads from 100 to 100k chunks, recovery memory"
CHUNK_BYTES = 4096
RSS_SLACK_MIB = 150
STAT_SAMPLES = 2000
NO_FLUSH = {"flush_interval_s": 3600.0, "flush_bytes": 4096 * MiB, "max_backlog_bytes": 4096 * MiB}


async def timed(calls: Iterable[Callable[[], Awaitable[Any]]]) -> Latency:
    found = []
    for call in calls:
        started = time.perf_counter()
        await call()
        found.append(time.perf_counter() - started)
    return Latency.of(found)


async def namespace(data_dir: Path, names: list[str]) -> dict[str, Any]:
    """Open (a restart), stat of 2,000 names, ``ls`` of ``small`` and ``big``; the floor: SQLite."""
    sample = random.Random(8).sample(names, min(STAT_SAMPLES, len(names)))
    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        open_s, rss = time.perf_counter() - started, memory_bytes()["VmRSS"]
        stat = await timed(functools.partial(store.stat, name) for name in sample)
        small = await timed([lambda: store.list("small")] * 50)
        started, big_entries = time.perf_counter(), len(await store.list("big"))
        big_s = time.perf_counter() - started
    db = sqlite3.connect(data_dir / "metadata.sqlite")
    floor = []
    for name in sample:
        started = time.perf_counter()
        db.execute("SELECT id, name, rev, value FROM segments WHERE name=?", (name,)).fetchone()
        floor.append(time.perf_counter() - started)
    db.close()
    return {"open_s": open_s, "rss_after_open_bytes": rss, "peak_bytes": memory_bytes()["VmHWM"], "stat_cold": stat,
            "stat_floor": Latency.of(floor), "ls_small": small, "ls_big_entries": big_entries, "ls_big_s": big_s}


async def first_open(data_dir: Path) -> dict[str, Any]:
    """The filled store's first open and close: the first metadata backup and the seal a
    store grown by its own daemon has, so the probes after it time a restart."""
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        assert store.metadata_backup is not None
        await store.metadata_backup.cycle()
    return {}


async def chunks(data_dir: Path, segment: str) -> dict[str, Any]:
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        info = await store.stat(segment)
        assert isinstance(info, SegmentInfo)
        await store.read(segment, 0, 4096)  # loads the chunk list, once
        rng = random.Random(3)
        read = await timed(functools.partial(store.read, segment, rng.randrange(0, info.length - 4096), 4096)
                           for _ in range(300))
    return {"read": read, "peak_bytes": memory_bytes()["VmHWM"]}


async def create_burst(data_dir: Path, count: int) -> dict[str, Any]:
    """``count`` creates through the store (journaled, as a daemon takes them), then a clean close."""
    async with open_store(StoreConfig(data_dir=data_dir)) as store:
        for index in range(count):
            await store.create(f"burst/s{index:07d}", make_parents=True)
    return {}


async def timed_open(data_dir: Path) -> dict[str, Any]:
    started = time.perf_counter()
    async with open_store(StoreConfig(data_dir=data_dir)):
        open_s = time.perf_counter() - started
    return {"open_s": open_s}


async def fill_journal(data_dir: Path, mib: int, append_bytes: int) -> None:
    """Unflushed appends, then exit without closing: what a crash leaves."""
    async with open_store(StoreConfig(data_dir=data_dir, **NO_FLUSH)) as store:  # type: ignore[arg-type]
        await store.create("journal/big", durability="vd", make_parents=True)
        data = os.urandom(append_bytes)
        for _ in range(mib * MiB // append_bytes):
            await store.append("journal/big", data)
        await store.sync("journal/big")
        print("{}", flush=True)
        os._exit(0)


async def recover(data_dir: Path) -> None:
    """Open the crashed store (journal replay) and exit without closing: open time, peak RSS."""
    config = StoreConfig(data_dir=data_dir, **NO_FLUSH)  # type: ignore[arg-type]
    started = time.perf_counter()
    async with open_store(config) as store:
        open_s = time.perf_counter() - started
        info = await store.stat("journal/big")
        assert isinstance(info, SegmentInfo)
        print(json.dumps({"open_s": open_s, "length": info.length, "peak_bytes": memory_bytes()["VmHWM"],
                          "tail_memory_bytes": config.tail_memory_bytes}), flush=True)
        os._exit(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--segments", default="1000,10000,100000,1000000", help="store sizes, comma-separated")
    parser.add_argument("--big-dir", type=int, default=100_000, help="segments in the one big directory")
    parser.add_argument("--chunks", default="100,1000,10000,100000", help="chunks per segment, comma-separated")
    parser.add_argument("--ls-entries", type=int, default=100_000, help="entries of the directory ls -l lists")
    parser.add_argument("--recover-mib", type=int, default=512, help="unflushed journal to recover")
    parser.add_argument("--burst-creates", type=int, default=50_000, help="creates before the restart of section 5")


def probe(*args: str) -> dict[str, Any]:
    return run_once("benchmarks.scale", *args)


def probe_namespace(directory: Path, total: int, big_dir: int) -> dict[str, Any]:
    """A store of ``total`` segments (``big_dir`` in ``big/``) filled, opened once, then probed."""
    data_dir, names_file = directory / f"segments-{total}", directory / f"names-{total}.txt"
    names_file.write_text("\n".join(fill_segments(data_dir, total, big_dir)))
    found = {"segments": total, **probe("first-open", str(data_dir)), **probe("namespace", str(data_dir), str(names_file))}
    shutil.rmtree(data_dir)
    return found


def fill_chunks(data_dir: Path, count: int) -> list[Path]:
    """A store with one segment ``chunked/seg`` of ``count`` 4 KiB chunk files."""
    data_dir.mkdir(parents=True)
    meta, now, rng = MetadataStore.sqlite(data_dir / "metadata.sqlite"), time.time_ns(), random.Random(count)
    chunk_records, paths = [], []
    for seq in range(1, count + 1):
        name, data = chunk_name(1, 0, seq), rng.randbytes(CHUNK_BYTES)
        path = data_dir / "chunks" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
        crcs = block_crcs_of(data)
        chunk_records.append(Chunk(name=name, segment_id=1, start_offset=(seq - 1) * CHUNK_BYTES, length=CHUNK_BYTES,
                                   crc32c=crcs.whole, block_crc32c=tuple(crcs.blocks), created_ns=now))
    record = SegmentMeta(segment_id=1, durability="pd", flushed_length=count * CHUNK_BYTES, chunk_count=count,
                         created_ns=now, modified_ns=now, next_chunk_seq=count + 1)
    with meta.database.transaction():
        meta.database.execute("INSERT INTO directories (name, value) VALUES (?, ?)",
                              ("chunked", records.dump(DirectoryMeta(created_ns=now))))
        meta.database.execute("INSERT INTO segments (id, name, rev, value) VALUES (1, 'chunked/seg', 1, ?)",
                              (records.dump(record),))
        meta.database.executemany("INSERT INTO chunks (segment_id, start_offset, value) VALUES (1, ?, ?)",
                                  ((c.start_offset, records.dump(c)) for c in chunk_records))
    meta.close()
    return paths


def pread_floor(paths: list[Path]) -> Latency:
    samples = []
    for path in random.Random(4).sample(paths, min(300, len(paths))):
        started = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 4096, 0)
        os.close(fd)
        samples.append(time.perf_counter() - started)
    return Latency.of(samples)


def ls_l_s(directory: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["ls", "-l", str(directory)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(directory: Path, args: argparse.Namespace) -> Report:
    segments = [probe_namespace(directory, int(total), args.big_dir) for total in args.segments.split(",")]
    chunk_rows, recovered = [], []
    for count in (int(s) for s in args.chunks.split(",")):
        paths = fill_chunks(directory / f"chunks-{count}", count)
        chunk_rows.append({"chunks": count, **probe("chunks", str(directory / f"chunks-{count}"), "chunked/seg"),
                           "pread_floor": pread_floor(paths).__dict__})
        shutil.rmtree(directory / f"chunks-{count}")
    fill_segments(directory / "ls-store", args.ls_entries + 10, args.ls_entries)
    (directory / "ls-plain").mkdir()
    for i in range(args.ls_entries):
        (directory / "ls-plain" / f"s{i:07d}").touch()
    listing = {"entries": args.ls_entries, "ceiling_s": [ls_l_s(directory / "ls-plain") for _ in range(2)]}
    with mounted(directory / "ls-store", directory / "ls-mnt") as mount:
        listing["fresh_s"], listing["again_s"] = ls_l_s(mount.path("big")), ls_l_s(mount.path("big"))
    for append_bytes in (1024, 64 * 1024):
        data_dir = directory / f"recover-{append_bytes}"
        probe("fill-journal", str(data_dir), str(args.recover_mib), str(append_bytes))
        os.sync()
        started, journal_bytes = time.perf_counter(), 0
        for path in sorted((data_dir / "journal").iterdir()):
            with open(path, "rb") as f:
                while piece := f.read(8 * MiB):
                    journal_bytes += len(piece)
        read_s = time.perf_counter() - started
        recovered.append({"append_bytes": append_bytes, "journal_bytes": journal_bytes, "read_s": read_s,
                          **probe("recover", str(data_dir))})
        shutil.rmtree(data_dir)
    burst_dir = directory / "burst"
    probe("create-burst", str(burst_dir), str(args.burst_creates))
    burst = {"creates": args.burst_creates, "first_open_s": probe("timed-open", str(burst_dir))["open_s"],
             "later_open_s": probe("timed-open", str(burst_dir))["open_s"]}
    shutil.rmtree(burst_dir)
    return report(segments, chunk_rows, listing, recovered, burst, args)


def report(segments: list[dict[str, Any]], chunk_rows: list[dict[str, Any]], listing: dict[str, Any],
           recovered: list[dict[str, Any]], burst: dict[str, Any], args: argparse.Namespace) -> Report:
    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:,.1f} ms"

    def pair(latency: dict[str, float]) -> str:
        return f"{latency['p50_us']:.0f}/{latency['p99_us']:.0f}"

    lines = ["1. segments: open, stat (from the metadata / SQLite floor, p50/p99 µs), ls"]
    lines += [f"  {r['segments']:>9,}: open {ms(r['open_s'])}, RSS {r['rss_after_open_bytes'] / MiB:.0f} MiB (peak "
              f"{r['peak_bytes'] / MiB:.0f}); stat {pair(r['stat_cold'])}, floor {pair(r['stat_floor'])}; ls of 10 "
              f"{r['ls_small']['p50_us']:.0f} µs, ls of {r['ls_big_entries']:,} {ms(r['ls_big_s'])}" for r in segments]
    lines.append("2. chunks per segment: random 4 KiB reads (p50/p99 µs) vs pread floor")
    lines += [f"  {r['chunks']:>9,}: read {pair(r['read'])} (floor {pair(r['pread_floor'])}), peak RSS "
              f"{r['peak_bytes'] / MiB:.0f} MiB" for r in chunk_rows]
    lines.append(f"3. ls -l of {listing['entries']:,} entries: the mount fresh {listing['fresh_s']:.2f} s, again "
                 f"{listing['again_s']:.2f} s; the scratch disk {listing['ceiling_s'][-1]:.2f} s (mount/disk "
                 f"{listing['fresh_s'] / listing['ceiling_s'][-1]:.1f}x)")
    lines.append(f"4. recovery of {args.recover_mib} MiB of unflushed VD appends")
    lines += [f"  {r['append_bytes']:>6} B appends: open {r['open_s']:.2f} s (reading the journal: {r['read_s']:.2f} s), "
              f"peak RSS {r['peak_bytes'] / MiB:.0f} MiB (bound {r['tail_memory_bytes'] / MiB + RSS_SLACK_MIB:.0f})"
              for r in recovered]
    lines.append(f"5. a restart after {burst['creates']:,} creates through the store: first open "
                 f"{ms(burst['first_open_s'])}, a later open {ms(burst['later_open_s'])} (the ceiling)")
    largest = segments[-1]
    checks = [Check(f"open at {largest['segments']:,} segments", largest["open_s"], 0.3, False, "s"),
              Check(f"stat p99 at {largest['segments']:,} segments", largest["stat_cold"]["p99_us"], 150, False, "µs"),
              Check(f"ls -l of {listing['entries']:,} on the mount, fresh", listing["fresh_s"], 3.0, False, "s"),
              *(Check(f"recovery peak RSS, {r['append_bytes']} B appends", r["peak_bytes"] / MiB,
                      r["tail_memory_bytes"] / MiB + RSS_SLACK_MIB, False, "MiB") for r in recovered),
              Check(f"first open after {burst['creates']:,} creates", burst["first_open_s"], 0.3, False, "s")]
    return Report("scale benchmark", [lines], checks, {"segments": segments, "chunks": chunk_rows, "ls": listing,
                                                       "recovery": recovered, "burst": burst})


if __name__ == "__main__":
    mode, data_dir, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    probes: dict[str, Callable[[], Awaitable[Any]]] = {
        "namespace": lambda: namespace(data_dir, Path(rest[0]).read_text().split("\n")),
        "first-open": lambda: first_open(data_dir), "chunks": lambda: chunks(data_dir, rest[0]),
        "fill-journal": lambda: fill_journal(data_dir, int(rest[0]), int(rest[1])), "recover": lambda: recover(data_dir),
        "create-burst": lambda: create_burst(data_dir, int(rest[0])), "timed-open": lambda: timed_open(data_dir)}
    found = trio.run(probes[mode])
    print(json.dumps(found, default=dataclasses.asdict), flush=True)
