"""Every byte served is verified: damaged chunks fail the read, never return wrong data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts.errors import ChunkMissingError, DataCorruptionError
from tierfs.testing.harness import small_config


async def _flushed_segment(data: Path, payload: bytes) -> dict:
    async with open_store(small_config(data, max_chunk_bytes=4 << 20)) as store:
        await store.create("c")
        await store.append("c", payload)
        await store.flush("c")
        (chunk,) = await store.chunk_layout("c")
    return chunk


async def test_flipped_byte_in_a_chunk_fails_the_read_and_fsck(tmp_path: Path) -> None:
    data = tmp_path / "d"
    payload = bytes(range(256)) * 8192  # 2 MiB: two blocks
    chunk = await _flushed_segment(data, payload)
    path = data / "chunks" / chunk["name"]
    raw = bytearray(path.read_bytes())
    raw[(1 << 20) + 5] ^= 0x01  # inside the second block
    path.write_bytes(bytes(raw))
    async with open_store(small_config(data)) as store:
        assert await store.read("c", 0, 1 << 20) == payload[: 1 << 20]  # first block is fine
        with pytest.raises(DataCorruptionError, match="CRC32C"):
            await store.read("c", (1 << 20), 10)
        with pytest.raises(DataCorruptionError):
            await store.read("c")
    result = subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data), "fsck"],
        capture_output=True, text=True,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "block 1" in result.stdout and "DAMAGED" in result.stdout


async def test_missing_and_short_chunks_are_clear_errors(tmp_path: Path) -> None:
    data = tmp_path / "d"
    chunk = await _flushed_segment(data, b"z" * 5000)
    path = data / "chunks" / chunk["name"]
    path.write_bytes(b"z" * 100)
    async with open_store(small_config(data)) as store:
        with pytest.raises(DataCorruptionError, match="returned 100"):
            await store.read("c")
    path.unlink()
    async with open_store(small_config(data)) as store:
        with pytest.raises(ChunkMissingError):
            await store.read("c")
