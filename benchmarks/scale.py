"""Scale: what opening the store, ``stat``, ``ls`` and recovery cost as the store
grows, next to the floor of the same work in the same run (issue 19, item 6).

1. **Segments** (``--segments``, default 1k,10k,100k,1M): a fresh data dir filled
   straight through the metadata (one transaction of bulk inserts: 10 segments in
   ``small/``, up to ``--big-dir`` (100k) in ``big/``, the rest in directories of
   1,000). A first process opens and closes the store once, as the daemon that grew a
   real store did: that open takes the store's first metadata backup (the whole
   database, uploaded to tier-2) and the clean close leaves the seal that tells the
   next open its backup is current (reported: how long that open and close took).
   Then a new process per size opens the store again (a restart) and reports: open
   time, RSS after open and peak, ``stat`` of 2,000 random names the first time (not in
   memory: one metadata lookup each) and again, ``ls`` of the 10-entry directory and
   of ``big/``, and how many metadata backups it took meanwhile (0 when the seal held).
   Floor: the same 2,000 lookups as bare SQLite queries on the metadata file.
2. **Chunks per segment** (``--chunks``, default 100,1k,10k,100k): one segment of N
   chunks of 4 KiB (chunk files written straight into the chunk store, records into
   the metadata). Reported: open, the first read (loads the chunk list: O(chunks),
   once), 300 random 4 KiB reads and ``stat`` after it. Floor of a read: ``pread`` of
   4 KiB of the same chunk files.
3. **``ls -l`` on the mount** (``--ls-entries``, default 100k): a store whose one
   directory holds that many segments (filled as in 1.), mounted (``tierfs mount``,
   verbose off), and ``ls -l`` of the directory on a fresh mount and again, next to
   ``ls -l`` of the same number of empty files in a directory of the scratch disk
   (ext4 here: the ceiling).
4. **Recovery** (``--recover-mib``, default 512, with 1 KiB and 64 KiB VD appends):
   appends that were never flushed, then the process exits as in a crash; a new
   process opens the store. Reported: open (replay) time and peak RSS, against the
   bound ``tail_memory_bytes`` + 150 MiB and the time to read the journal files.

Targets (issue 19): open <= 0.3 s at 1M segments; stat p99 <= 150 µs at 1M segments;
``ls -l`` of 100k entries on the mount <= 3 s; recovery peak RSS <= tail memory budget + 150 MiB, time linear in the unflushed bytes.
A missed target is reported, not an error: the exit code is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment
from benchmarks.common import (
    EXIT_OK,
    Check,
    Latency,
    add_scratch_arguments,
    format_checks,
    make_scratch_directory,
)

HELP = "store open, stat and ls from 1k to 1M segments, reads from 100 to 100k chunks, recovery memory"
MiB = 1 << 20
CHUNK_BYTES = 4096
RSS_SLACK_MIB = 150  # the allowance above the configured tail budget


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser)
    parser.add_argument("--segments", default="1000,10000,100000,1000000", help="store sizes, comma-separated")
    parser.add_argument("--big-dir", type=int, default=100_000, help="segments in the one big directory")
    parser.add_argument("--chunks", default="100,1000,10000,100000", help="chunks per segment, comma-separated")
    parser.add_argument("--ls-entries", type=int, default=100_000, help="entries of the directory ls -l lists")
    parser.add_argument("--recover-mib", type=int, default=512, help="unflushed journal to recover")


def _probe(*args: str) -> dict[str, Any]:
    done = subprocess.run(child_command("benchmarks.scale_probe", *args), env=child_environment(),
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"scale_probe {args[0]} failed: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------- 1. segments
def fill_segments(data_dir: Path, total: int, big_dir: int) -> tuple[list[str], str]:
    from tierfs.engine import records
    from tierfs.engine.metadata.store import MetadataStore
    from tierfs.engine.record_types import DirectoryMeta, SegmentMeta

    data_dir.mkdir(parents=True)
    meta = MetadataStore.sqlite(data_dir / "metadata.sqlite")
    now = time.time_ns()
    big = min(big_dir, max(0, total - 10))
    names = [f"small/s{i}" for i in range(10)] + [f"big/s{i:07d}" for i in range(big)]
    names += [f"spread/d{i // 1000:04d}/s{i}" for i in range(max(0, total - len(names)))]
    directories = sorted({"small", "big", "spread", *(n.rsplit("/", 1)[0] for n in names)})
    directory_value = records.dump(DirectoryMeta(created_ns=now, modified_ns=now))
    db = meta.database
    with db.transaction():
        db.executemany("INSERT INTO directories (name, value) VALUES (?, ?)", ((d, directory_value) for d in directories))
        db.executemany("INSERT INTO segments (id, name, rev, value) VALUES (?, ?, 1, ?)", (
            (i, name, records.dump(SegmentMeta(segment_id=i, durability="pd", created_ns=now, modified_ns=now)))
            for i, name in enumerate(names, start=1)))
    meta.close()
    return names, "big"


def segment_scaling(directory: Path, sizes: list[int], big_dir: int) -> list[dict[str, Any]]:
    results = []
    for total in sizes:
        data_dir = directory / f"segments-{total}"
        names, big = fill_segments(data_dir, total, big_dir)
        names_file = directory / f"names-{total}.txt"
        names_file.write_text("\n".join(names))
        first = _probe("first-open", str(data_dir))
        results.append({"segments": total, **first, **_probe("namespace", str(data_dir), str(names_file), big)})
        shutil.rmtree(data_dir)
        names_file.unlink()
    return results


# ---------------------------------------------------------------- 2. chunks
def fill_chunks(data_dir: Path, count: int) -> list[Path]:
    from tierfs.blocks.checksums import block_crcs_of
    from tierfs.engine import records
    from tierfs.engine.metadata.store import MetadataStore
    from tierfs.engine.object_keys import chunk_name
    from tierfs.engine.record_types import Chunk, DirectoryMeta, SegmentMeta

    data_dir.mkdir(parents=True)
    meta = MetadataStore.sqlite(data_dir / "metadata.sqlite")
    now = time.time_ns()
    rng = random.Random(count)
    chunk_records, paths = [], []
    for seq in range(1, count + 1):
        name = chunk_name(1, 0, seq)
        data = rng.randbytes(CHUNK_BYTES)
        path = data_dir / "chunks" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
        crcs = block_crcs_of(data)
        chunk_records.append(Chunk(name=name, segment_id=1, start_offset=(seq - 1) * CHUNK_BYTES,
                                   length=CHUNK_BYTES, crc32c=crcs.whole, block_crc32c=tuple(crcs.blocks),
                                   created_ns=now))
    record = SegmentMeta(segment_id=1, durability="pd", flushed_length=count * CHUNK_BYTES, chunk_count=count,
                         created_ns=now, modified_ns=now, next_chunk_seq=count + 1)
    db = meta.database
    with db.transaction():
        db.execute("INSERT INTO directories (name, value) VALUES (?, ?)",
                   ("chunked", records.dump(DirectoryMeta(created_ns=now))))
        db.execute("INSERT INTO segments (id, name, rev, value) VALUES (1, 'chunked/seg', 1, ?)",
                   (records.dump(record),))
        db.executemany("INSERT INTO chunks (segment_id, start_offset, value) VALUES (1, ?, ?)",
                       ((c.start_offset, records.dump(c)) for c in chunk_records))
    meta.close()
    return paths


def pread_floor(paths: list[Path]) -> Latency:
    rng = random.Random(4)
    samples = []
    for path in rng.sample(paths, min(300, len(paths))):
        started = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 4096, 0)
        os.close(fd)
        samples.append(time.perf_counter() - started)
    return Latency.of(samples)


def chunk_scaling(directory: Path, sizes: list[int]) -> list[dict[str, Any]]:
    results = []
    for count in sizes:
        data_dir = directory / f"chunks-{count}"
        paths = fill_chunks(data_dir, count)
        figures = _probe("chunks", str(data_dir), "chunked/seg")
        results.append({"chunks": count, **figures, "pread_floor": pread_floor(paths).__dict__})
        shutil.rmtree(data_dir)
    return results


# ---------------------------------------------------------------- 3. ls -l on the mount
def _ls_l_s(directory: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["ls", "-l", str(directory)], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def ls_on_mount(directory: Path, entries: int) -> dict[str, Any]:
    from tierfs.testing.harness import Mount

    data_dir = directory / "ls-store"
    fill_segments(data_dir, entries + 10, entries)
    plain = directory / "ls-plain"
    plain.mkdir()
    for i in range(entries):
        (plain / f"s{i:07d}").touch()
    ceiling = [_ls_l_s(plain) for _ in range(2)]
    figures: dict[str, Any] = {"entries": entries, "ceiling_s": ceiling}
    mount = Mount(data_dir, directory / "ls-mnt", verbose=False)
    try:
        figures["fresh_s"] = _ls_l_s(mount.path("big"))
        figures["again_s"] = _ls_l_s(mount.path("big"))
    finally:
        mount.unmount()
    shutil.rmtree(data_dir)
    shutil.rmtree(plain)
    return figures


# ---------------------------------------------------------------- 4. recovery
def recovery(directory: Path, mib: int) -> list[dict[str, Any]]:
    results = []
    for append_bytes in (1024, 64 * 1024):
        data_dir = directory / f"recover-{append_bytes}"
        _probe("fill-journal", str(data_dir), str(mib), str(append_bytes))
        subprocess.run(["sync"], check=False)
        started = time.perf_counter()
        journal_bytes = 0
        for path in sorted((data_dir / "journal").iterdir()):
            with open(path, "rb") as f:
                while piece := f.read(8 * MiB):
                    journal_bytes += len(piece)
        read_s = time.perf_counter() - started
        figures = _probe("recover", str(data_dir))
        results.append({"append_bytes": append_bytes, "journal_bytes": journal_bytes, "read_s": read_s, **figures})
        shutil.rmtree(data_dir)
    return results


# ---------------------------------------------------------------- report
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def run(args: argparse.Namespace) -> int:
    directory = make_scratch_directory(args.dir)
    try:
        segments = segment_scaling(directory, [int(s) for s in args.segments.split(",")], args.big_dir)
        chunk_rows = chunk_scaling(directory, [int(s) for s in args.chunks.split(",")])
        listing = ls_on_mount(directory, args.ls_entries)
        recovered = recovery(directory, args.recover_mib)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out = sys.stdout
    print("1. segments: open, stat (first time / again / SQLite floor, p50/p99 µs), ls", file=out)
    for r in segments:
        cold, warm, floor = r["stat_cold"], r["stat_warm"], r["stat_floor"]
        print(f"  {r['segments']:>9,}: open {_ms(r['open_s'])}, RSS {r['rss_after_open_kib'] / 1024:.0f} MiB "
              f"(peak {r['peak_kib'] / 1024:.0f}); stat {cold['p50_us']:.0f}/{cold['p99_us']:.0f}, "
              f"{warm['p50_us']:.0f}/{warm['p99_us']:.0f}, floor {floor['p50_us']:.0f}/{floor['p99_us']:.0f}; "
              f"ls of 10 {r['ls_small']['p50_us']:.0f} µs, ls of {r['ls_big_entries']:,} {_ms(r['ls_big_s'])}; "
              f"first open and close {r['first_open_close_s']:.2f} s ({r['first_backups']} backup, "
              f"{'sealed' if r['sealed'] else 'no seal'}), backups while probing {r['backups_while_probing']}",
              file=out)
    print("2. chunks per segment: open, first read, random 4 KiB reads (p50/p99 µs) vs pread floor", file=out)
    for r in chunk_rows:
        print(f"  {r['chunks']:>9,}: open {_ms(r['open_s'])}, first read {_ms(r['first_read_s'])}, "
              f"read {r['read']['p50_us']:.0f}/{r['read']['p99_us']:.0f} (floor {r['pread_floor']['p50_us']:.0f}/"
              f"{r['pread_floor']['p99_us']:.0f}), stat {r['stat']['p50_us']:.0f}/{r['stat']['p99_us']:.0f}", file=out)
    print(f"3. ls -l of {listing['entries']:,} entries: the mount fresh {listing['fresh_s']:.2f} s, again "
          f"{listing['again_s']:.2f} s; the scratch disk {listing['ceiling_s'][-1]:.2f} s "
          f"(mount/disk {listing['fresh_s'] / listing['ceiling_s'][-1]:.1f}x)", file=out)
    print(f"4. recovery of {args.recover_mib} MiB of unflushed VD appends", file=out)
    for r in recovered:
        print(f"  {r['append_bytes']:>6} B appends: open {r['open_s']:.2f} s (reading the journal: {r['read_s']:.2f} s), "
              f"peak RSS {r['peak_kib'] / 1024:.0f} MiB (bound {r['tail_memory_bytes'] / MiB + RSS_SLACK_MIB:.0f})",
              file=out)
    largest = segments[-1]
    checks = [
        Check(f"open at {largest['segments']:,} segments", largest["open_s"], 0.3, at_least=False, unit="s"),
        Check(f"stat p99 at {largest['segments']:,} segments", largest["stat_cold"]["p99_us"], 150, at_least=False,
              unit="µs"),
        Check(f"ls -l of {listing['entries']:,} on the mount, fresh", listing["fresh_s"], 3.0, at_least=False,
              unit="s"),
        *(Check(f"recovery peak RSS, {r['append_bytes']} B appends", r["peak_kib"] / 1024,
                r["tail_memory_bytes"] / MiB + RSS_SLACK_MIB, at_least=False, unit="MiB") for r in recovered),
    ]
    for line in format_checks(checks):
        print(line, file=out)
    return EXIT_OK
