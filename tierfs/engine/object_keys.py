"""Names of every object tierfs writes, computed from ids, never from segment names.

- A chunk in the chunk store: ``s<segment id>/e<owner epoch>-c<sequence>``. Two owners
  never share an epoch, so no two owners ever write the same object; a rename or a
  concat changes metadata only.
- The two objects of one offload attempt in the long-term store: ``<chunk name>-<attempt
  UUID>.data`` and ``.index``; two attempts never write the same key, so a failed
  attempt's objects can be found and deleted by the next one.
- Garbage: names queued for deletion once their metadata is gone; long-term keys carry
  ``LONG_TERM_GARBAGE_PREFIX``.

- Shapes: ``chunk_shape``/``offload_key_shape`` recognise exactly these two forms
  (and nothing else a store may hold, e.g. ``_owner/`` or ``_metadata/`` objects), so
  orphan collection never considers any other object.

Invariants: every name here is a pure function of ids; nothing on the read or write
path lists a store to find an object.
"""

from __future__ import annotations

import dataclasses
import re
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


_CHUNK_PATTERN = r"s(?P<segment>[0-9]{8})/e(?P<epoch>[0-9]{6})-c(?P<seq>[0-9]{8})"
_CHUNK_SHAPE = re.compile(_CHUNK_PATTERN)
_OFFLOAD_KEY_SHAPE = re.compile(
    _CHUNK_PATTERN + r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    + f"(?:{re.escape(DATA_SUFFIX)}|{re.escape(INDEX_SUFFIX)})"
)


@dataclasses.dataclass(frozen=True)
class ChunkShape:
    """The ids a chunk name (or the chunk part of an offload key) carries."""

    segment_id: int
    epoch: int
    seq: int


def _shape(pattern: re.Pattern[str], name: str) -> ChunkShape | None:
    match = pattern.fullmatch(name)
    if match is None:
        return None
    return ChunkShape(int(match["segment"]), int(match["epoch"]), int(match["seq"]))


def chunk_shape(name: str) -> ChunkShape | None:
    """The ids of a tier-2 chunk name ``s<8 digits>/e<6 digits>-c<8 digits>``, else None."""
    return _shape(_CHUNK_SHAPE, name)


def offload_key_shape(key: str) -> ChunkShape | None:
    """The chunk ids of an offload attempt's key (``<chunk name>-<UUID>.data``/``.index``),
    else None."""
    return _shape(_OFFLOAD_KEY_SHAPE, key)


@dataclasses.dataclass(frozen=True)
class ObjectReferences:
    """Every object name the metadata knows at one instant: chunk names and offload
    keys its chunk records reference, names queued as garbage (long-term ones without
    their prefix), and each live segment's ``next_chunk_seq``."""

    tier2: frozenset[str]
    long_term: frozenset[str]
    queued_tier2: frozenset[str]
    queued_long_term: frozenset[str]
    next_chunk_seq: dict[int, int]  # by segment id
