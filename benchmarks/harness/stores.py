"""Segments to measure: written in-process or through a daemon's API and flushed, read
front to back or at random offsets; big stores filled straight through the metadata.

Invariant: a written segment is flushed whole before it is measured (checked), and a
timed read loop fails on a short read instead of counting the bytes it missed.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

from benchmarks.harness.figures import Latency, MiB
from tierfs.engine import records
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.record_types import DirectoryMeta, SegmentMeta

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient
    from tierfs.store.facade import SegmentStore


async def write_segment(store: SegmentStore, name: str, payload: bytes, piece_bytes: int = MiB,
                        durability: str | None = None) -> list[dict[str, Any]]:
    """``name`` created and appended in ``piece_bytes`` pieces, flushed; its chunk layout."""
    await store.create(name, make_parents=True, **({"durability": durability} if durability else {}))
    view = memoryview(payload)
    for offset in range(0, len(payload), piece_bytes):
        await store.append(name, view[offset : offset + piece_bytes])
    await store.flush()
    layout: list[dict[str, Any]] = await store.chunk_layout(name)
    _check_flushed(name, layout, len(payload))
    return layout


def write_via_client(client: TierClient, name: str, payload: bytes, piece_bytes: int = 4 * MiB,
                     durability: str | None = None) -> list[dict[str, Any]]:
    """The same through a daemon's API (``TierClient.append``), flushed; its layout."""
    client.create(name, parents=True, **({"durability": durability} if durability else {}))
    for offset in range(0, len(payload), piece_bytes):
        client.append(name, payload[offset : offset + piece_bytes], offset)
    client.op("flush", path=name)
    layout = client.layout(name)
    _check_flushed(name, layout, len(payload))
    return layout


def _check_flushed(name: str, layout: list[dict[str, Any]], size: int) -> None:
    flushed = sum(chunk["end"] - chunk["start"] for chunk in layout)
    if flushed != size:
        raise RuntimeError(f"{name}: tier-2 holds {flushed} of {size} bytes after the flush")


async def sequential_scan(store: SegmentStore, name: str, size: int, read_bytes: int = MiB,
                          expected: bytes | None = None) -> tuple[float, Any]:
    """``name`` read front to back by a new reader, each piece checked against ``expected`` if given."""
    reader = store.open_reader(name)
    offset = 0
    start_s = perf_counter()
    while offset < size:
        data = await reader.read(offset, read_bytes)
        if not data or (expected is not None and data != expected[offset : offset + len(data)]):
            raise RuntimeError(f"the read of {name} at {offset} of {size} returned {len(data)} other bytes")
        offset += len(data)
    return perf_counter() - start_s, reader


async def random_reads(store: SegmentStore, name: str, size: int, count: int, read_bytes: int = 4096,
                       seed: int = 3) -> Latency:
    """``count`` reads of ``read_bytes`` at seeded aligned offsets through one reader, each timed."""
    rng = random.Random(seed)
    offsets = [rng.randrange(max(1, size // read_bytes)) * read_bytes for _ in range(count)]
    reader = store.open_reader(name)
    latencies_s = []
    for offset in offsets:
        start_s = perf_counter()
        await reader.read(offset, read_bytes)
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s)


def fill_segments(data_dir: Path, total: int, big_dir: int) -> list[str]:
    """A new store of ``total`` empty PD segments inserted straight into its metadata: 10 in
    ``small/``, up to ``big_dir`` in ``big/``, the rest in directories of 1,000; their names."""
    data_dir.mkdir(parents=True)
    meta, now = MetadataStore.sqlite(data_dir / "metadata.sqlite"), time.time_ns()
    names = [f"small/s{i}" for i in range(10)] + [f"big/s{i:07d}" for i in range(min(big_dir, max(0, total - 10)))]
    names += [f"spread/d{i // 1000:04d}/s{i}" for i in range(max(0, total - len(names)))]
    directories = sorted({"small", "big", "spread", *(n.rsplit("/", 1)[0] for n in names)})
    directory_value = records.dump(DirectoryMeta(created_ns=now, modified_ns=now))
    with meta.database.transaction():
        meta.database.executemany("INSERT INTO directories (name, value) VALUES (?, ?)",
                                  ((d, directory_value) for d in directories))
        meta.database.executemany("INSERT INTO segments (id, name, rev, value) VALUES (?, ?, 1, ?)", (
            (i, name, records.dump(SegmentMeta(segment_id=i, durability="pd", created_ns=now, modified_ns=now)))
            for i, name in enumerate(names, start=1)))
    meta.close()
    return names


def warm_cache_bytes(size: int) -> int:
    """A block-cache budget that holds a whole ``size``-byte segment with room to spare."""
    return max(300 * MiB, size + size // 4)
