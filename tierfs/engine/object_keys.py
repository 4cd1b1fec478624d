"""Names of every object tierfs writes, computed from ids, never from segment names.

- A chunk in the chunk store: ``s<segment id>/e<owner epoch>-c<sequence>``. Two owners
  never share an epoch, so no two owners ever write the same object; a rename or a
  concat changes metadata only.
- The two objects of one offload attempt in the long-term store: ``<chunk name>-<attempt
  UUID>.data`` and ``.index``; two attempts never write the same key, so a failed
  attempt's objects can be found and deleted by the next one.
- Garbage: names queued for deletion once their metadata is gone; long-term keys carry
  ``LONG_TERM_GARBAGE_PREFIX``.

Invariants: every name here is a pure function of ids; nothing on the read or write
path lists a store to find an object.
"""

from __future__ import annotations

import dataclasses
import uuid

from tierfs.engine.record_types import Chunk

DATA_SUFFIX = ".data"
INDEX_SUFFIX = ".index"


def chunk_name(segment_id: int, epoch: int, seq: int) -> str:
    """Tier-2 object name of a chunk: from ids only, never from the segment name."""
    return f"s{segment_id:08d}/e{epoch:06d}-c{seq:08d}"


def new_attempt_uuid() -> str:
    return str(uuid.uuid4())


@dataclasses.dataclass(frozen=True)
class OffloadKeys:
    """Where one attempt's objects go, relative to the long-term store's URL."""

    data: str
    index: str

    @classmethod
    def for_attempt(cls, chunk_name: str, attempt_uuid: str) -> OffloadKeys:
        # chunk names are already id-derived: "s00000007/e000003-c00000012"
        uuid.UUID(attempt_uuid)  # a malformed UUID must never become part of a key
        base = f"{chunk_name}-{attempt_uuid}"
        return cls(base + DATA_SUFFIX, base + INDEX_SUFFIX)


LONG_TERM_GARBAGE_PREFIX = "longterm:"


def garbage_names(chunk: Chunk) -> list[str]:
    """Objects to delete once ``chunk`` is gone from the metadata:
    its chunk-store copy unless already deleted, and the objects of its offload attempt
    (earlier attempts' objects were deleted before that attempt was recorded).
    Long-term keys carry ``LONG_TERM_GARBAGE_PREFIX``."""
    names = [] if chunk.offload_hot_deleted else [chunk.name]
    if chunk.offload_attempt_uuid:
        keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)
        names += [LONG_TERM_GARBAGE_PREFIX + keys.data, LONG_TERM_GARBAGE_PREFIX + keys.index]
    return names
