"""The long-term object format of offloaded chunks: keys, index objects, checks."""

from __future__ import annotations

import pytest

from tierfs import __version__
from tierfs.blocks.checksums import BLOCK_BYTES, block_crcs_of
from tierfs.contracts.errors import DataCorruptionError
from tierfs.engine import records
from tierfs.engine.object_keys import OffloadKeys, new_attempt_uuid
from tierfs.engine.record_types import Chunk
from tierfs.offload.offload_format import (
    FORMAT_METADATA_KEY,
    FORMAT_VERSION,
    decode_index,
    encode_index,
    object_metadata,
)


def chunk_record(data: bytes, name: str = "s00000007/e000003-c00000012") -> Chunk:
    crcs = block_crcs_of(data)
    return Chunk(name=name, segment_id=7, start_offset=4096, length=len(data),
                 crc32c=crcs.whole, block_crc32c=tuple(crcs.blocks), epoch=3)


def test_keys_derive_from_ids_and_differ_per_attempt() -> None:
    first, second = new_attempt_uuid(), new_attempt_uuid()
    keys = OffloadKeys.for_attempt("s00000007/e000003-c00000012", first)
    assert keys.data == f"s00000007/e000003-c00000012-{first}.data"
    assert keys.index == f"s00000007/e000003-c00000012-{first}.index"
    assert OffloadKeys.for_attempt("s00000007/e000003-c00000012", second).data != keys.data
    with pytest.raises(ValueError):
        OffloadKeys.for_attempt("s00000007/e000003-c00000012", "../../escape")


def test_the_index_round_trips_with_every_field() -> None:
    data = bytes(range(256)) * (BLOCK_BYTES // 256 * 2 + 3)
    chunk = chunk_record(data)
    attempt = new_attempt_uuid()
    index = decode_index(encode_index("logs/app.log", chunk, attempt), chunk, "mem://x.index")
    assert index.format_version == FORMAT_VERSION
    assert (index.segment_name, index.segment_id, index.chunk_name) == (
        "logs/app.log", 7, "s00000007/e000003-c00000012")
    assert (index.start_offset, index.length, index.block_bytes) == (4096, len(data), BLOCK_BYTES)
    assert list(index.block_crc32c) == list(chunk.block_crc32c) and len(index.block_crc32c) == 3
    assert index.crc32c == chunk.crc32c and index.attempt_uuid == attempt
    assert index.software_version == __version__ and index.created_ns > 0
    assert object_metadata() == {FORMAT_METADATA_KEY: str(FORMAT_VERSION)}


def test_an_index_that_does_not_match_its_chunk_is_refused() -> None:
    chunk = chunk_record(b"a" * 5000)
    other = chunk_record(b"b" * 5000)
    encoded = encode_index("logs/app.log", chunk, new_attempt_uuid())
    with pytest.raises(DataCorruptionError, match="crc32c"):
        decode_index(encoded, other, "mem://x.index")
    with pytest.raises(DataCorruptionError, match="cannot be read"):
        decode_index(b"\xff\xff\xff garbage", chunk, "mem://x.index")
    future = records.OffloadIndex.FromString(encoded)
    future.format_version = FORMAT_VERSION + 1
    with pytest.raises(DataCorruptionError, match="format"):
        decode_index(future.SerializeToString(), chunk, "mem://x.index")
