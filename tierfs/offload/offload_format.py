"""The format of offloaded chunks in the long-term object store (Pulsar PIP-17 style).

An offloaded chunk is two objects under the long-term URL:

- the **data object** ``<key>.data``: exactly the chunk's committed bytes, nothing
  added, so a 1 MiB block of the chunk is a ranged GET of the same range;
- the **index object** ``<key>.index``: an ``OffloadIndex`` protobuf record with the
  segment name and id, the chunk's name, segment offset and length, the per-1 MiB-block
  CRC32Cs, the whole-chunk CRC32C, the format version, the attempt UUID, the software
  version and the time.

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

import time
from typing import Any

from google.protobuf.message import DecodeError

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.contracts.errors import DataCorruptionError
from tierfs.contracts.version import __version__
from tierfs.engine import records

FORMAT_VERSION = 1
FORMAT_METADATA_KEY = "tierfs-format"



def object_metadata() -> dict[str, str]:
    """User metadata stored with both objects of an offload."""
    return {FORMAT_METADATA_KEY: str(FORMAT_VERSION)}


def encode_index(segment_name: str, chunk: Any, attempt_uuid: str) -> bytes:
    """The index object for ``chunk`` (a ``ChunkRecord``) of ``segment_name``."""
    index = records.OffloadIndex(
        format_version=FORMAT_VERSION,
        segment_name=segment_name,
        segment_id=chunk.segment_id,
        chunk_name=chunk.name,
        start_offset=chunk.start_offset,
        length=chunk.length,
        block_bytes=BLOCK_BYTES,
        crc32c=chunk.crc32c,
        attempt_uuid=attempt_uuid,
        software_version=__version__,
        created_ns=time.time_ns(),
    )
    index.block_crc32c.extend(chunk.block_crc32c)
    return records.encode(index)


def decode_index(data: bytes, chunk: Any, url: str) -> Any:
    """The ``OffloadIndex`` in ``data``, checked against the chunk record it describes."""
    try:
        index = records.decode(records.OffloadIndex, data)
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
    if list(index.block_crc32c) != list(chunk.block_crc32c):
        mismatches.append("block_crc32c")
    if mismatches:
        raise DataCorruptionError(
            f"offload index {url} does not describe chunk {chunk.name}: "
            f"{', '.join(mismatches)} differ"
        )
    return index
