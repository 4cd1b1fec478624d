"""Direct chunk reads: the fsspec plugin reads flushed bytes from chunk files itself,
verified per 1 MiB block, and only the unflushed tail through the daemon."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from tierfs.fsspec_impl import TierFileSystem

from tierfs import open_store
from tierfs.blocks.checksums import BLOCK_BYTES, block_crcs_of
from tierfs.contracts.errors import ChunkUnavailable, DataCorruptionError
from tierfs.remote.direct_read import ChunkRef, DirectChunkReader, SegmentLayout, read_directly
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


def _packed_ref(path: Path, data: bytes, start: int, end: int) -> ChunkRef:
    """Segment bytes [start, end) as a chunk at ``start`` of the file ``path`` holding ``data``."""
    return ChunkRef(f"file://{path}", start, end, tuple(block_crcs_of(data[start:end]).blocks), object_offset=start)


def test_a_layout_with_a_gap_or_an_overlap_is_unavailable_never_short(tmp_path: Path) -> None:
    data = payload(30, 11)
    path = tmp_path / "pack"
    path.write_bytes(data)
    reader = DirectChunkReader()
    whole = SegmentLayout(1, (_packed_ref(path, data, 0, 10), _packed_ref(path, data, 10, 20),
                              _packed_ref(path, data, 20, 30)))
    assert reader.read(whole, 0, 30) == data and reader.read(whole, 10, 25) == data[10:25]

    gap = SegmentLayout(1, (_packed_ref(path, data, 0, 10), _packed_ref(path, data, 20, 30)))
    overlap = SegmentLayout(1, (_packed_ref(path, data, 0, 10), _packed_ref(path, data, 5, 30)))
    for layout, start, end in ((gap, 0, 30), (gap, 12, 25), (gap, 5, 21), (overlap, 0, 30), (overlap, 2, 12)):
        with pytest.raises(ChunkUnavailable, match="contiguously"):
            reader.read(layout, start, end)
    # a range inside one chunk is served: every byte of it is there, once
    assert reader.read(gap, 20, 30) == data[20:] and reader.read(gap, 2, 9) == data[2:9]
    assert reader.read(overlap, 8, 12) == data[8:12]


def test_a_layout_with_a_gap_is_read_through_the_daemon(tfs: TierFileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "direct/gap"
    assert tfs.direct is not None
    data = payload(700_000, 12)
    write_flushed(tfs, name, data)
    (entry,) = tfs.client.layout(name)

    def piece(start: int, end: int) -> dict[str, object]:  # bytes [start, end) of the chunk, as a chunk of its own
        crcs = list(block_crcs_of(data[start:end]).blocks)
        return {**entry, "start": start, "end": end, "block_crc32c": crcs, "object_offset": start}

    layout = [piece(0, 250_000), piece(250_000, 400_000), piece(400_000, len(data))]
    monkeypatch.setattr(tfs.client, "layout", lambda _name: layout)
    direct_before = tfs.direct.bytes_read
    assert read_directly(tfs.direct, tfs.client, name, 0, None, False) == data
    assert tfs.direct.bytes_read - direct_before == len(data), "three adjacent chunks: read directly"

    del layout[1]  # as if the middle chunk's record were missing: 150,000 bytes unaccounted for
    direct_before, daemon_before = tfs.direct.bytes_read, tfs.bytes_fetched_daemon
    assert read_directly(tfs.direct, tfs.client, name, 0, None, False) == data
    assert tfs._read_with_layout(name, SegmentLayout.from_json(layout), 0, None) == data
    assert tfs.direct.bytes_read == direct_before, "nothing was read from a layout with a gap"
    assert tfs.bytes_fetched_daemon - daemon_before == len(data)
