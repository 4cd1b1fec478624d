"""Reads over every record of the metadata, for start-up and orphan collection: they
decode only the protobuf fields they need and build no ``Chunk``.

Invariant: each runs on the store's one metadata worker thread like every other
metadata call, so no commit falls between the statements of one scan.
"""

from __future__ import annotations

import operator

from tierfs.engine import records
from tierfs.engine.metadata.database import Database
from tierfs.engine.object_keys import (
    LONG_TERM_GARBAGE_PREFIX,
    ObjectReferences,
    OffloadKeys,
    held_pack,
)

# the fields of a chunk record (``Chunk``) that the start-up scan reads
_HOT_COPY_FIELDS = operator.attrgetter(
    "segment_id", "start_offset", "offload_complete", "offload_hot_deleted", "offload_completed_ns"
)
# the fields orphan collection reads off chunk and segment records
_REFERENCE_FIELDS = operator.attrgetter("name", "offload_attempt_uuid", "offload_hot_deleted")
_NEXT_CHUNK_SEQ = operator.attrgetter("next_chunk_seq")


def hot_copies_pending(db: Database) -> dict[tuple[int, int], int]:
    """(segment id, chunk start) -> completion time (ns) of every offloaded chunk whose
    chunk-store copy still exists. Read once at start-up over every chunk record, so
    it reads the five fields it needs off the protobuf message and builds no
    ``Chunk``."""
    pending: dict[tuple[int, int], int] = {}
    for (value,) in db.execute("SELECT value FROM chunks"):
        segment_id, start, complete, hot_deleted, completed_ns = _HOT_COPY_FIELDS(
            records.decode(records.ChunkRecord, value)
        )
        if complete and not hot_deleted:
            pending[(segment_id, start)] = completed_ns
    return pending

def object_references(db: Database) -> ObjectReferences:
    """Every object name the metadata references or queues, and each segment's next
    chunk sequence, as of one instant: the store runs every call through one worker
    thread, so no commit falls between these reads (orphan collection relies on it)."""
    tier2: set[str] = set()
    long_term: set[str] = set()
    for (value,) in db.execute("SELECT value FROM chunks"):
        name, attempt, hot_deleted = _REFERENCE_FIELDS(records.decode(records.ChunkRecord, value))
        if not hot_deleted:  # its chunk-store copy is gone (a pack's is another's, or nobody's)
            tier2.add(name)
        if attempt:
            long_term.update(OffloadKeys.for_attempt(name, attempt).both)
    next_seq = {
        segment_id: int(_NEXT_CHUNK_SEQ(records.decode(records.SegmentRecord, value)))
        for segment_id, value in db.execute("SELECT id, value FROM segments")
    }
    queued = [n for (n,) in db.execute("SELECT name FROM garbage")]
    prefix = LONG_TERM_GARBAGE_PREFIX
    return ObjectReferences(
        frozenset(tier2), frozenset(long_term),
        frozenset(held_pack(n) for n in queued if not n.startswith(prefix)),  # a hold keeps its pack
        frozenset(n[len(prefix):] for n in queued if n.startswith(prefix)),
        next_seq,
    )
