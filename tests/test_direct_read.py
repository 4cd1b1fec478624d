"""Direct chunk reads: the fsspec plugin reads flushed bytes from chunk files itself,
verified per 1 MiB block, and only the unflushed tail through the daemon."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from tierfs.fsspec_impl import TierFileSystem

from tierfs import open_store
from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.contracts.errors import ChunkUnavailable, DataCorruptionError
from tierfs.remote.direct_read import ChunkRef, DirectChunkReader, SegmentLayout
from tierfs.testing.harness import Daemon, small_config

MiB = 1 << 20


def payload(size: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


def write_flushed(fs: TierFileSystem, name: str, data: bytes) -> None:
    fs.pipe_file(name, data)
    fs.client.op("flush", path=name)


def chunk_path(fs: TierFileSystem, name: str, index: int = 0) -> Path:
    url = fs.chunk_layout(name)[index]["url"]
    assert url.startswith("file://")
    return Path(url[len("file://"):])


def test_flushed_bytes_are_read_from_chunks_and_the_tail_through_the_daemon(tfs: TierFileSystem) -> None:
    flushed = payload(3 * MiB + 12345, 1)
    write_flushed(tfs, "direct/mixed", flushed)
    tail = payload(70_000, 2)
    tfs.append("direct/mixed", tail)
    expected = flushed + tail
    assert tfs.info("direct/mixed")["flushed_length"] == len(flushed)

    daemon_before, direct_before = tfs.bytes_fetched_daemon, tfs.bytes_fetched_direct
    assert tfs.cat_file("direct/mixed") == expected
    assert tfs.bytes_fetched_daemon - daemon_before == len(tail)
    assert tfs.bytes_fetched_direct - direct_before == len(flushed)

    # ranges inside one block, across blocks, across the flushed end
    for start, end in ((5, 17), (MiB - 3, MiB + 3), (len(flushed) - 10, len(flushed) + 10),
                       (0, len(expected)), (len(expected) - 1, len(expected))):
        assert tfs.cat_file("direct/mixed", start, end) == expected[start:end]

    with fsspec.open("tierfs://direct/mixed", "rb") as f:
        assert f.read() == expected


def test_a_corrupted_chunk_fails_the_read_and_returns_nothing(tfs: TierFileSystem) -> None:
    data = payload(2 * MiB + 100, 3)
    write_flushed(tfs, "direct/corrupt", data)
    path = chunk_path(tfs, "direct/corrupt")
    with open(path, "r+b") as f:
        f.seek(MiB + 10)
        original = f.read(1)
        f.seek(MiB + 10)
        f.write(bytes([original[0] ^ 0xFF]))
    try:
        assert tfs.cat_file("direct/corrupt", 0, 1000) == data[:1000]  # block 0 is intact
        with pytest.raises(DataCorruptionError, match="block 1"):
            tfs.cat_file("direct/corrupt", MiB + 5, MiB + 20)
        with pytest.raises(OSError):
            with fsspec.open("tierfs://direct/corrupt", "rb") as f:
                f.read()
    finally:
        with open(path, "r+b") as f:
            f.seek(MiB + 10)
            f.write(original)


def test_an_unreadable_chunk_is_read_through_the_daemon(tfs: TierFileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    data = payload(MiB + 500, 4)
    write_flushed(tfs, "direct/fallback", data)
    assert tfs.direct is not None

    def unavailable(*args: object) -> list[bytes]:
        raise ChunkUnavailable("chunk store not reachable from here")

    monkeypatch.setattr(tfs.direct, "_read_local", unavailable)
    daemon_before = tfs.bytes_fetched_daemon
    assert tfs.cat_file("direct/fallback") == data
    assert tfs.bytes_fetched_daemon - daemon_before == len(data)


def test_bytes_beyond_the_committed_length_of_a_chunk_file_are_never_returned(tfs: TierFileSystem) -> None:
    data = payload(300_000, 5)
    write_flushed(tfs, "direct/extra", data)
    layout = tfs.segment_layout("direct/extra")
    path = chunk_path(tfs, "direct/extra")
    with open(path, "ab") as f:  # what an uncommitted flush before a crash leaves
        f.write(b"x" * 5000)
    assert tfs.direct is not None
    assert tfs.direct.read(layout, 0, len(data)) == data
    with pytest.raises(ValueError, match="beyond the chunks"):
        tfs.direct.read(layout, 0, len(data) + 1)


def test_an_open_file_never_reads_a_segment_that_replaced_it(tfs: TierFileSystem) -> None:
    write_flushed(tfs, "direct/replaced", payload(10_000, 6))
    f = fsspec.open("tierfs://direct/replaced", "rb").open()
    try:
        tfs.rm("direct/replaced")
        write_flushed(tfs, "direct/replaced", payload(10_000, 7))
        with pytest.raises(FileNotFoundError, match="replaced since it was opened"):
            f.read()
    finally:
        f.close()


def test_direct_reads_can_be_turned_off(daemon: Daemon) -> None:
    fs = TierFileSystem(data_dir=str(daemon.data_dir), direct_reads=False, skip_instance_cache=True)
    data = payload(400_000, 8)
    write_flushed(fs, "direct/off", data)
    assert fs.cat_file("direct/off") == data
    assert fs.bytes_fetched_direct == 0 and fs.bytes_fetched_daemon == len(data)


async def test_remote_chunks_are_read_with_storage_options_verified_and_cached(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    url, options = s3_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options,
                          max_chunk_bytes=3 * MiB, max_flush_bytes=3 * MiB, flush_bytes=MiB)
    data = payload(5 * MiB + 777, 9)
    async with open_store(config) as store:
        await store.create("s3/seg", make_parents=True)
        for offset in range(0, len(data), MiB):
            await store.append("s3/seg", data[offset : offset + MiB])
        await store.flush()
        layout = SegmentLayout.from_json(await store.chunk_layout("s3/seg"))
    assert len(layout.chunks) >= 2 and layout.flushed_end == len(data)

    assert not DirectChunkReader().can_read(layout.chunks[0].url)
    reader = DirectChunkReader(dict(options))
    assert reader.read(layout, 0, len(data)) == data
    fetched = reader.bytes_read
    assert fetched == len(data)
    start = 2 * MiB + 5
    assert reader.read(layout, start, start + BLOCK_BYTES) == data[start : start + BLOCK_BYTES]
    assert reader.bytes_read == fetched, "verified remote blocks are served from the cache"

    missing = SegmentLayout(layout.segment_id, tuple(
        ChunkRef(c.url + "-gone", c.start, c.end, c.block_crc32c) for c in layout.chunks))
    with pytest.raises(ChunkUnavailable):
        DirectChunkReader(dict(options)).read(missing, 0, 10)


def test_a_missing_local_chunk_file_is_unavailable(tmp_path: Path) -> None:
    layout = SegmentLayout(1, (ChunkRef(f"file://{tmp_path}/nothing", 0, 10, (0,)),))
    with pytest.raises(ChunkUnavailable, match="cannot open"):
        DirectChunkReader().read(layout, 0, 10)
