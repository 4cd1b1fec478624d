"""Typed values of the metadata records: what the engine passes around.

Each is a frozen dataclass with the fields of one protobuf message of ``records.py``
(same names, so ``chunk.start_offset`` reads as before; repeated fields are tuples).
They are converted to and from protobuf only where the metadata store reads and writes
them (``records.load``/``records.dump`` in ``metadata/store.py``).

Invariants:
- Values are never changed in place: a change is ``dataclasses.replace``, so a reader
  holding an old value keeps a consistent snapshot and comparing values compares their
  contents.
- Defaults are protobuf's (0, "", False, empty), so a record that never set a field
  reads the same before and after a round trip.
- ``slots=True``: the read path looks up chunk fields on every read; slot access is
  the cheapest attribute access Python has.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tierfs.engine import records


@dataclasses.dataclass(frozen=True, slots=True)
class StoreMeta:
    """The data dir's own record: the owner epoch and the journal checkpoint."""

    MESSAGE: ClassVar[str] = "StoreRecord"

    epoch: int = 0
    journal_checkpoint_lsn: int = 0
    created_ns: int = 0
    # objects named with an owner epoch below this are another lineage's (engine/upkeep/orphans.py)
    foreign_below_epoch: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class DirectoryMeta:
    """A directory (or the root) with its offload and retention policy: a key applies
    only if its bit (``policy.POLICY_KEYS`` order) is set in ``policy_set``."""

    MESSAGE: ClassVar[str] = "DirectoryRecord"

    created_ns: int = 0
    policy_set: int = 0
    offload_after_s: int = 0
    offload_hot_bytes: int = 0
    retention_s: int = 0
    retention_bytes: int = 0
    modified_ns: int = 0
    changed_ns: int = 0
    accessed_ns: int = 0
    mode: int = 0
    owner_set: bool = False
    uid: int = 0
    gid: int = 0
    rewrite_replaces: int = 0
    directory_id: int = 0  # from the segments' id sequence: one id names one entry ever


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentMeta:
    """A segment's record. ``start_offset``: bytes below it were deleted by retention;
    ``txn_writer_ids``/``txn_writer_seqs``: parallel tuples, writer id -> highest
    ``writer_seq`` a concat committed for it (oldest first)."""

    MESSAGE: ClassVar[str] = "SegmentRecord"

    segment_id: int = 0
    durability: str = ""
    sealed: bool = False
    flushed_length: int = 0
    chunk_count: int = 0
    created_ns: int = 0
    modified_ns: int = 0
    next_chunk_seq: int = 0
    sealed_ns: int = 0  # when it was last sealed (offload_after_s)
    start_offset: int = 0
    txn_writer_ids: tuple[str, ...] = ()
    txn_writer_seqs: tuple[int, ...] = ()
    changed_ns: int = 0
    accessed_ns: int = 0
    mtime_set_length: int = 0  # appends up to this length are older than modified_ns
    mode: int = 0
    owner_set: bool = False
    uid: int = 0
    gid: int = 0
    # the last flushed append of recent writers (``segments.writer_marks``): parallel tuples
    append_writers: tuple[int, ...] = ()
    append_writer_seqs: tuple[int, ...] = ()
    append_writer_offsets: tuple[int, ...] = ()
    append_writer_lengths: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a segment: segment bytes ``[start_offset, start_offset + length)``.

    ``location`` is "" while the chunk store holds the copy that is read, else the
    long-term data object's URL. The offload fields follow Pulsar PIP-17: the attempt's
    UUID is recorded before any upload, so a later attempt can find and delete a
    failed one's objects."""

    MESSAGE: ClassVar[str] = "ChunkRecord"

    name: str = ""
    segment_id: int = 0
    start_offset: int = 0
    length: int = 0
    crc32c: int = 0
    block_crc32c: tuple[int, ...] = ()  # one per 1 MiB block
    epoch: int = 0
    created_ns: int = 0
    location: str = ""
    offload_attempt_uuid: str = ""
    offload_complete: bool = False
    offload_hot_deleted: bool = False  # the chunk-store copy is gone
    offload_completed_ns: int = 0
    # Where byte 0 of the chunk is in object ``name``: 0 for a chunk of its own; a
    # chunk packed with other segments' small chunks into one object (the storage
    # writer's batches, ``object_keys.pack_name``) has its place there. Long-term
    # copies (``location``) always hold the chunk alone, from byte 0.
    object_offset: int = 0


for _value_type in (StoreMeta, DirectoryMeta, SegmentMeta, Chunk):
    records.check_value_type(_value_type)


@dataclasses.dataclass
class SegmentRow:
    """A segment's row as the metadata holds it: id, name, the row's revision (bumped by
    every commit, so a conditional update notices a concurrent one) and its record."""

    segment_id: int
    name: str
    rev: int
    record: SegmentMeta
