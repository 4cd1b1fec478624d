"""The format of offloaded chunks in the long-term object store (Pulsar PIP-17 style).

An offloaded chunk is two objects under the long-term URL:

- the **data object** ``<key>.data``: exactly the chunk's committed bytes, nothing
  added, so a 1 MiB block of the chunk is a ranged GET of the same range;
- the **index object** ``<key>.index``: an ``OffloadIndex`` protobuf record with the
  segment name and id, the chunk's name, segment offset and length, the per-1 MiB-block
  CRC32Cs, the whole-chunk CRC32C, the format version, the attempt UUID, the software
  version and the time. In memory it is an ``IndexObject`` (same field names), converted
  here only, once per fetch of the object.

Invariants:
- Keys derive from ids, never from names: ``s<segment id>/<chunk file name>-<attempt
  UUID>``. A rename moves no object, and two attempts never write the same key, so an
  attempt that failed halfway can be found and deleted by the next one.
- ``FORMAT_VERSION`` is written into the index record and into both objects' user
  metadata (``tierfs-format``); a reader rejects versions it does not know.
- ``decode_index`` checks what it reads against what the metadata expects (chunk name,
  length, CRCs): an index object that does not match is an error, never trusted. The
  segment name, id and offset in the index record where the chunk was at offload time
  (a rename or a concat moves the chunk, not its objects).
"""

from __future__ import annotations

import dataclasses
import time
from typing import ClassVar

from google.protobuf.message import DecodeError

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.contracts.errors import DataCorruptionError
from tierfs.contracts.version import __version__
from tierfs.engine import records
from tierfs.engine.record_types import Chunk

FORMAT_VERSION = 1
FORMAT_METADATA_KEY = "tierfs-format"


@dataclasses.dataclass(frozen=True, slots=True)
class IndexObject:
    """The contents of an index object: the chunk as it was at offload time."""

    MESSAGE: ClassVar[str] = "OffloadIndex"

    format_version: int = 0
    segment_name: str = ""
    segment_id: int = 0
    chunk_name: str = ""
    start_offset: int = 0
    length: int = 0
    block_bytes: int = 0
    crc32c: int = 0
    block_crc32c: tuple[int, ...] = ()
    attempt_uuid: str = ""
    software_version: str = ""
    created_ns: int = 0


records.check_value_type(IndexObject)


def object_metadata() -> dict[str, str]:
    """User metadata stored with both objects of an offload."""
    return {FORMAT_METADATA_KEY: str(FORMAT_VERSION)}


def encode_index(segment_name: str, chunk: Chunk, attempt_uuid: str) -> bytes:
    """The index object for ``chunk`` of ``segment_name``."""
    index = IndexObject(
        format_version=FORMAT_VERSION,
        segment_name=segment_name,
        segment_id=chunk.segment_id,
        chunk_name=chunk.name,
        start_offset=chunk.start_offset,
        length=chunk.length,
        block_bytes=BLOCK_BYTES,
        crc32c=chunk.crc32c,
        block_crc32c=chunk.block_crc32c,
        attempt_uuid=attempt_uuid,
        software_version=__version__,
        created_ns=time.time_ns(),
    )
    return records.dump(index)


def decode_index(data: bytes, chunk: Chunk, url: str) -> IndexObject:
    """The index object in ``data``, checked against the chunk record it describes."""
    try:
        index = records.load(IndexObject, data)
    except (DecodeError, records.RecordVersionError) as e:
        raise DataCorruptionError(f"offload index {url} cannot be read: {e}") from None
    if index.format_version != FORMAT_VERSION:
        raise DataCorruptionError(
            f"offload index {url} has format {index.format_version}; this tierfs reads {FORMAT_VERSION}"
        )
    mismatches = [
        field
        for field, expected in (
            ("chunk_name", chunk.name),
            ("length", chunk.length),
            ("crc32c", chunk.crc32c),
            ("block_bytes", BLOCK_BYTES),
        )
        if getattr(index, field) != expected
    ]
    if index.block_crc32c != chunk.block_crc32c:
        mismatches.append("block_crc32c")
    if mismatches:
        raise DataCorruptionError(
            f"offload index {url} does not describe chunk {chunk.name}: "
            f"{', '.join(mismatches)} differ"
        )
    return index
