"""Recovery holds about the tail memory budget whatever the journal holds: past the
budget, replayed appends stay in their journal frames, and consecutive frames of one
segment share one tail entry, whose bytes are read back (every frame CRC-checked) when
they are read or flushed."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import DataCorruptionError
from tierfs.engine.segments.tail import MERGED_ENTRY_MAX_BYTES
from tierfs.testing.harness import small_config

KiB = 1 << 10
APPENDS = 3000
NO_FLUSH = dict(flush_interval_s=3600.0, flush_bytes=1 << 30, max_backlog_bytes=1 << 30,
                journal_file_bytes=1 << 20, tail_memory_bytes=64 * KiB)

CRASHING_WRITER = textwrap.dedent("""
    import os, random, sys, trio
    from pathlib import Path
    from tierfs import open_store
    from tierfs.testing.harness import small_config

    async def main():
        config = small_config(Path(sys.argv[1]), **{nf!r})
        async with open_store(config) as store:
            for name in ("a", "b"):
                await store.create(name)
            rng = random.Random(1)
            for i in range({appends}):
                await store.append("ab"[i % 2], rng.randbytes(rng.randrange(1, 2 * 1024)))
            os._exit(0)  # acknowledged (PD), never flushed: what kill -9 leaves
    trio.run(main)
""").format(nf=NO_FLUSH, appends=APPENDS)


def expected_contents() -> dict[str, bytes]:
    rng = random.Random(1)
    contents = {"a": bytearray(), "b": bytearray()}
    for i in range(APPENDS):
        contents["ab"[i % 2]] += rng.randbytes(rng.randrange(1, 2 * 1024))
    return {name: bytes(data) for name, data in contents.items()}


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(data_dir)], check=True, timeout=120)
    return data_dir


async def test_replayed_small_appends_share_entries_and_read_back_exactly(crashed: Path) -> None:
    expected = expected_contents()
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:  # type: ignore[arg-type]
        for name, data in expected.items():
            seg = store.table.segment(name)
            # the budget's worth in memory, then one entry per merged MiB, not per append
            assert len(seg.tail) < 64 + len(data) // MERGED_ENTRY_MAX_BYTES + 8, len(seg.tail)
            assert store.tail_budget.used_bytes <= 64 * KiB
            assert await store.read(name) == data
        await store.flush()  # the flush re-reads the merged frames too
        for name, data in expected.items():
            assert await store.read(name) == data
        report = await store.fsck()
        assert report.problems == []


async def test_a_corrupt_frame_inside_a_merged_entry_fails_the_read(crashed: Path) -> None:
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:  # type: ignore[arg-type]
        seg = store.table.segment("b")
        merged = [e for e in seg.tail._entries if e.frames > 3]
        assert merged, "recovery should have merged evicted frames"
        entry = merged[len(merged) // 2]
        journal_files = sorted((crashed / "journal").iterdir())
        start = max(int(p.stem) for p in journal_files if int(p.stem) <= entry.frame_lsn)
        path = crashed / "journal" / f"{start:020d}.jnl"
        position = entry.end_lsn - 1 - start  # the last data byte of its last frame
        with open(path, "r+b") as f:
            f.seek(position)
            byte = f.read(1)
            f.seek(position)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(DataCorruptionError, match="CRC32C"):
            await store.read("b", entry.offset, entry.length)
        await trio.lowlevel.checkpoint()
