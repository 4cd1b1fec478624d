"""Reads ask the metadata only for the chunk records they cover: a segment's whole chunk
list is never loaded to serve a read, so the first read of a segment of 100k chunks
costs what a read of one of 100 does (``benchmarks scale``)."""

from __future__ import annotations

import random
from pathlib import Path

from tierfs import open_store
from tierfs.testing.harness import small_config

KiB = 1 << 10


async def test_reads_resolve_chunks_without_loading_the_list(tmp_path: Path) -> None:
    config = small_config(tmp_path / "data", max_chunk_bytes=16 * KiB, flush_bytes=16 * KiB,
                          max_flush_bytes=16 * KiB)
    rng = random.Random(7)
    payload = rng.randbytes(60 * 16 * KiB + 123)
    async with open_store(config) as store:
        await store.create("many")
        for offset in range(0, len(payload), 16 * KiB):
            await store.append("many", payload[offset : offset + 16 * KiB])
            await store.flush("many")
        assert (await store.stat("many")).chunk_count >= 60  # type: ignore[union-attr]
    async with open_store(config) as store:
        seg = store.table.segment("many")
        for _ in range(50):
            start = rng.randrange(0, len(payload))
            length = rng.randrange(1, 100 * KiB)
            assert await store.read("many", start, length) == payload[start : start + length]
        reader = store.open_reader("many")
        out = bytearray()
        while len(out) < len(payload):
            out += await reader.read(len(out), 24 * KiB)
        assert bytes(out) == payload
        assert reader.statistics().prefetched_blocks > 0  # read-ahead without the list
        assert seg.chunks is None  # nothing read the whole list
        await store.append("many", b"more")  # a flush loads it, and keeps it written through
        await store.flush("many")
        assert seg.chunks is not None
        assert await store.read("many", len(payload) - 10) == payload[-10:] + b"more"
        assert (await store.fsck()).problems == []
