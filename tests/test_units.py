"""Small units: config precedence and validation, CRCs, records, metadata, cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tierfs.blocks.checksums import BLOCK_BYTES, BlockCrcs, block_crcs_of, crc32c
from tierfs.contracts.config import load_config
from tierfs.contracts.errors import ConcurrentModificationError, InvalidArgumentError
from tierfs.engine import records
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.read.block_cache import BlockCache
from tierfs.engine.record_types import Chunk, SegmentMeta


def test_config_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('flush_bytes = 100\nflush_interval_s = 2.5\ndurability = "vd"\n')
    env = {"TIERFS_FLUSH_BYTES": "200", "TIERFS_TIER2": "memory://x"}
    config = load_config({"flush_bytes": 300}, environ=env, config_file=toml)
    assert (config.flush_bytes, config.flush_interval_s, config.durability) == (300, 2.5, "vd")
    assert config.chunk_store_url == "memory://x"
    assert load_config(environ=env, config_file=toml).flush_bytes == 200
    defaults = load_config(environ={})
    assert defaults.chunk_store_url == str(defaults.data_dir / "chunks")


@pytest.mark.parametrize(
    "overrides", [{"durability": "x"}, {"flush_bytes": 0}, {"flush_interval_s": "soon"}, {"nope": 1}]
)
def test_config_rejects_bad_values(overrides: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        load_config(overrides, environ={})


def test_block_crcs_extend_equals_whole() -> None:
    data = bytes(range(256)) * 9000  # ~2.2 MiB
    running = BlockCrcs()
    for start in range(0, len(data), 300_001):
        running.extend(data[start : start + 300_001])
    whole = block_crcs_of(data)
    assert running == whole
    assert whole.whole == crc32c(data)
    assert whole.blocks[1] == crc32c(data[BLOCK_BYTES : 2 * BLOCK_BYTES])
    assert len(whole.blocks) == 3


def test_records_carry_and_check_versions() -> None:
    data = records.encode(records.ChunkRecord(name="c", length=3))
    assert records.decode(records.ChunkRecord, data).version == records.RECORD_VERSION
    future = records.ChunkRecord(name="c", version=records.RECORD_VERSION + 1).SerializeToString()
    with pytest.raises(records.RecordVersionError):
        records.decode(records.ChunkRecord, future)


def test_typed_records_keep_the_stored_format() -> None:
    """A value dumps to the bytes of the protobuf message with the same fields, and
    loads back equal (repeated fields as tuples), so existing data dirs open."""
    chunk = Chunk(name="s00000007/e000003-c00000012", segment_id=7, start_offset=4096,
                  length=5, crc32c=9, block_crc32c=(9,), epoch=3, offload_complete=True)
    message = records.ChunkRecord(name=chunk.name, segment_id=7, start_offset=4096, length=5,
                                  crc32c=9, block_crc32c=[9], epoch=3, offload_complete=True)
    assert records.dump(chunk) == records.encode(message)
    assert records.load(Chunk, records.encode(message)) == chunk
    segment = SegmentMeta(durability="pd", txn_writer_ids=("a", "b"), txn_writer_seqs=(1, 2))
    assert records.load(SegmentMeta, records.dump(segment)) == segment
    with pytest.raises(records.RecordVersionError):
        records.load(Chunk, records.ChunkRecord(version=records.RECORD_VERSION + 1).SerializeToString())


def test_metadata_conditional_updates(tmp_path: Path) -> None:
    meta = MetadataStore.sqlite(tmp_path / "m.sqlite")
    row = meta.create_segment("s", "", SegmentMeta(durability="pd"))
    new_rev = meta.update_segment(row, SegmentMeta(durability="vd"))
    assert new_rev == row.rev + 1
    with pytest.raises(ConcurrentModificationError):
        meta.update_segment(row, SegmentMeta(durability="pd"))  # stale revision
    assert meta.load_segments()[0].record.durability == "vd"
    assert meta.begin_epoch().epoch == 1 and meta.begin_epoch().epoch == 2
    meta.close()


async def test_block_cache_lru_by_bytes_and_single_flight(autojump_clock: MockClock) -> None:
    # autojump: the only waits are the fake fetch's sleeps (no threads, no I/O)
    cache = BlockCache(capacity_bytes=3000)
    calls = 0

    async def fetch() -> bytes:
        nonlocal calls
        calls += 1
        await trio.sleep(0.01)
        return b"x" * 1000

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(cache.get, "k", fetch)
    assert calls == 1
    for key in "abcd":
        await cache.get(key, fetch)
    stats = cache.statistics()
    assert stats.used_bytes <= 3000 and stats.evictions >= 2
    assert stats.gets == calls == 5
