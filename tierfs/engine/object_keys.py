"""Names of every object tierfs writes, computed from ids, never from segment names.

- A chunk in the chunk store: ``s<segment id>/e<owner epoch>-c<sequence>``. Two owners
  never share an epoch, so no two owners ever write the same object; a rename or a
  concat changes metadata only.
- A pack in the chunk store: ``packs/e<owner epoch>-<UUID hex>``, one object holding
  the small chunks of many segments that the storage writer flushed in one batch
  (each chunk record has its ``object_offset`` there). A fresh UUID per write: a pack
  name is never written twice, not even by a retried batch. The garbage collector never
  deletes a pack (other segments' chunks may still be in it): the orphan sweep does,
  once no chunk record references it and no hold is queued (``pack_hold``: a chunk
  that left it, queued with the deletion lag of whatever removed it).
- The two objects of one offload attempt in the long-term store: ``<chunk name>-<attempt
  UUID>.data`` and ``.index``; two attempts never write the same key, so a failed
  attempt's objects can be found and deleted by the next one.
- Garbage: names queued for deletion once their metadata is gone; long-term keys carry
  ``LONG_TERM_GARBAGE_PREFIX``.

- Shapes: ``chunk_shape``/``pack_epoch``/``offload_key_shape`` recognise exactly these
  forms (and nothing else a store may hold, e.g. ``_owner/`` or ``_metadata/``
  objects), so orphan collection never considers any other object.

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


PACK_PREFIX = "packs/"


def pack_name(epoch: int) -> str:
    """A new pack object's name (``packs/e<epoch>-<UUID hex>``): never used before."""
    return f"{PACK_PREFIX}e{epoch:06d}-{uuid.uuid4().hex}"


def is_pack_name(name: str) -> bool:
    """Whether ``name`` is a pack (or a pack's hold in the garbage queue)."""
    return name.startswith(PACK_PREFIX)


# separates a pack's name from the chunk a hold is for: never part of a chunk or pack name
_HOLD_SEPARATOR = "@"


def pack_hold(chunk: Chunk) -> str:
    """The garbage-queue entry for a packed chunk that left the metadata: it names the
    pack (and the chunk, so every leaving chunk has its own entry and its own time).
    Collecting it deletes nothing; while it is queued the orphan sweep keeps the pack,
    so a defrag's deletion lag holds for packs too (readers that still hold the old
    chunk list read the pack until then)."""
    return f"{chunk.name}{_HOLD_SEPARATOR}{chunk.segment_id}-{chunk.start_offset}"


def held_pack(queued: str) -> str:
    """The object a garbage-queue entry keeps: a hold's pack, else the name itself."""
    return queued.partition(_HOLD_SEPARATOR)[0] if is_pack_name(queued) else queued


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

    @property
    def both(self) -> tuple[str, str]:
        """The attempt's two keys: its data object, then its index object."""
        return (self.data, self.index)


LONG_TERM_GARBAGE_PREFIX = "longterm:"


def garbage_names(chunk: Chunk) -> list[str]:
    """Objects to delete once ``chunk`` is gone from the metadata:
    its chunk-store copy unless already deleted, and the objects of its offload attempt
    (earlier attempts' objects were deleted before that attempt was recorded).
    Long-term keys carry ``LONG_TERM_GARBAGE_PREFIX``. A packed chunk's copy is never
    deleted by name (other segments' chunks may still be in the pack: the orphan sweep
    deletes it once unreferenced); a hold (``pack_hold``) is queued instead."""
    if chunk.offload_hot_deleted:
        names = []
    elif is_pack_name(chunk.name):
        names = [pack_hold(chunk)]
    else:
        names = [chunk.name]
    if chunk.offload_attempt_uuid:
        keys = OffloadKeys.for_attempt(chunk.name, chunk.offload_attempt_uuid)
        names += [LONG_TERM_GARBAGE_PREFIX + keys.data, LONG_TERM_GARBAGE_PREFIX + keys.index]
    return names


_CHUNK_PATTERN = r"s(?P<segment>[0-9]{8})/e(?P<epoch>[0-9]{6})-c(?P<seq>[0-9]{8})"
_PACK_PATTERN = re.escape(PACK_PREFIX) + r"e(?P<pack_epoch>[0-9]{6})-[0-9a-f]{32}"
_CHUNK_SHAPE = re.compile(f"{_CHUNK_PATTERN}|{_PACK_PATTERN}")
_OFFLOAD_KEY_SHAPE = re.compile(
    f"(?:{_CHUNK_PATTERN}|{_PACK_PATTERN})" + r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    + f"(?:{re.escape(DATA_SUFFIX)}|{re.escape(INDEX_SUFFIX)})"
)


@dataclasses.dataclass(frozen=True)
class ChunkShape:
    """The ids a chunk or pack name (or the chunk part of an offload key) carries; a
    pack's are its epoch alone (segment id and sequence 0, ``pack`` set)."""

    segment_id: int
    epoch: int
    seq: int
    pack: bool = False


def _shape(pattern: re.Pattern[str], name: str) -> ChunkShape | None:
    match = pattern.fullmatch(name)
    if match is None:
        return None
    if match["pack_epoch"] is not None:
        return ChunkShape(0, int(match["pack_epoch"]), 0, pack=True)
    return ChunkShape(int(match["segment"]), int(match["epoch"]), int(match["seq"]))


def chunk_shape(name: str) -> ChunkShape | None:
    """The ids of a tier-2 chunk name ``s<8 digits>/e<6 digits>-c<8 digits>`` or pack
    name ``packs/e<6 digits>-<32 hex digits>``, else None."""
    return _shape(_CHUNK_SHAPE, name)


def offload_key_shape(key: str) -> ChunkShape | None:
    """The chunk ids of an offload attempt's key (``<chunk or pack name>-<UUID>.data``/
    ``.index``), else None."""
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
