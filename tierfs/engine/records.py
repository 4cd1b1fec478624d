"""Protobuf records persisted in the metadata database, and their codec.

The message types are declared here in Python (a ``FileDescriptorProto``) instead of a
generated ``_pb2`` module, so no protoc run is needed to build tierfs. The wire format
is ordinary proto3, readable by any protobuf implementation given the same schema.

The engine never handles these messages: it passes frozen dataclasses around
(``record_types``: ``Chunk``, ``SegmentMeta``, ...; ``offload_format.IndexObject``),
whose fields have the messages' names. ``load`` and ``dump`` convert between the two,
and only where records are read and written (the metadata store, the offload index).

Invariants:
- Every record has ``version`` as field 1; readers reject versions newer than
  ``RECORD_VERSION`` instead of misreading them; ``dump`` writes ``RECORD_VERSION``.
- Field numbers are never reused; new fields get new numbers.
- A value type has exactly the message's fields, ``version`` aside (``check_value_type``
  at import), repeated fields as tuples. Fields this tierfs does not know are not kept
  when it rewrites a record, so a field whose loss would matter comes with a new
  ``RECORD_VERSION``.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

# 2: POSIX attributes on segment and directory records (a tierfs that knows version 1
# only would drop them when it rewrote a record, so it refuses version 2 records)
# 3: chunks packed into shared objects (``ChunkRecord.object_offset``): a tierfs that
# knows version 2 only would read a packed chunk from the object's start, and delete
# the shared object with one of its chunks
RECORD_VERSION = 3

_T = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "uint64": _T.TYPE_UINT64,
    "uint32": _T.TYPE_UINT32,
    "int64": _T.TYPE_INT64,
    "string": _T.TYPE_STRING,
    "bool": _T.TYPE_BOOL,
    "bytes": _T.TYPE_BYTES,
}

# message name -> [(field name, type, repeated)], field numbers are positions + 1.
_SCHEMA: dict[str, list[tuple[str, str, bool]]] = {
    "StoreRecord": [
        ("version", "uint32", False),
        ("epoch", "uint64", False),
        ("journal_checkpoint_lsn", "uint64", False),
        ("created_ns", "uint64", False),
        # objects of owner epochs below this may be referenced by another data dir's
        # metadata (a takeover from it, a restore): the orphan sweep keeps them
        ("foreign_below_epoch", "uint64", False),
    ],
    "DirectoryRecord": [
        ("version", "uint32", False),
        ("created_ns", "uint64", False),
        # offload and retention policy (policy.py); a key applies only if its bit
        # (POLICY_KEYS order) is set in policy_set, so 0 stays a usable value
        ("policy_set", "uint32", False),
        ("offload_after_s", "uint64", False),
        ("offload_hot_bytes", "uint64", False),
        ("retention_s", "uint64", False),
        ("retention_bytes", "uint64", False),
        # POSIX attributes (store/attributes.py): 0 times mean "as created"
        ("modified_ns", "uint64", False),  # last change of the entries, or the last set
        ("changed_ns", "uint64", False),
        ("accessed_ns", "uint64", False),
        ("mode", "uint32", False),  # permission bits (attributes.MODE_SET); 0: the default (0755)
        ("owner_set", "bool", False),  # uid/gid below were set (else: the daemon's)
        ("uid", "uint32", False),
        ("gid", "uint32", False),
        ("rewrite_replaces", "uint32", False),  # policy key (policy_set bit 4)
        # from the segments' id sequence, never reused: the mount's inode number
        ("directory_id", "uint64", False),
    ],
    "SegmentRecord": [
        ("version", "uint32", False),
        ("segment_id", "uint64", False),
        ("durability", "string", False),
        ("sealed", "bool", False),
        ("flushed_length", "uint64", False),
        ("chunk_count", "uint32", False),
        ("created_ns", "uint64", False),
        ("modified_ns", "uint64", False),
        ("next_chunk_seq", "uint64", False),
        ("sealed_ns", "uint64", False),  # when it was last sealed (offload_after_s)
        # bytes below this offset were deleted by retention (whole chunks from the head)
        ("start_offset", "uint64", False),
        # transactions committed by concat with a writer id (Pravega's segment
        # attributes): parallel lists, writer id -> highest committed writer_seq
        ("txn_writer_ids", "string", True),
        ("txn_writer_seqs", "uint64", True),
        # POSIX attributes (store/attributes.py). modified_ns above is the time of the
        # last append a flush committed, or the last explicit set; an explicit set also
        # records the appended length it covers, so appends up to it never move mtime
        ("changed_ns", "uint64", False),
        ("accessed_ns", "uint64", False),
        ("mtime_set_length", "uint64", False),
        ("mode", "uint32", False),  # permission bits; 0: the default (0644)
        ("owner_set", "bool", False),  # uid/gid below were set (else: the daemon's)
        ("uid", "uint32", False),
        ("gid", "uint32", False),
        # exactly-once appends (writer_marks.py): parallel lists, the last flushed
        # append of each of the most recent writers (a lost one only weakens retries)
        ("append_writers", "uint64", True),
        ("append_writer_seqs", "uint64", True),
        ("append_writer_offsets", "uint64", True),
        ("append_writer_lengths", "uint64", True),
    ],
    "ChunkRecord": [
        ("version", "uint32", False),
        ("name", "string", False),
        ("segment_id", "uint64", False),
        ("start_offset", "uint64", False),
        ("length", "uint64", False),
        ("crc32c", "uint32", False),
        ("block_crc32c", "uint32", True),
        ("epoch", "uint64", False),
        ("created_ns", "uint64", False),
        ("location", "string", False),  # "": the chunk store; else the long-term object URL
        # offload context (Pulsar PIP-17): the attempt's UUID is recorded before any
        # upload, so a later attempt can find and delete a failed one's objects
        ("offload_attempt_uuid", "string", False),
        ("offload_complete", "bool", False),
        ("offload_hot_deleted", "bool", False),  # the chunk-store copy is gone
        ("offload_completed_ns", "uint64", False),
        # where the chunk's first byte is in object ``name``: 0, or its place in a pack
        # object shared with other segments' small chunks (object_keys.pack_name)
        ("object_offset", "uint64", False),
    ],
    # The index object stored next to an offloaded chunk's data object.
    "OffloadIndex": [
        ("version", "uint32", False),
        ("format_version", "uint32", False),
        ("segment_name", "string", False),
        ("segment_id", "uint64", False),
        ("chunk_name", "string", False),
        ("start_offset", "uint64", False),
        ("length", "uint64", False),
        ("block_bytes", "uint32", False),
        ("crc32c", "uint32", False),
        ("block_crc32c", "uint32", True),
        ("attempt_uuid", "string", False),
        ("software_version", "string", False),
        ("created_ns", "uint64", False),
    ],
}


def _build() -> dict[str, type[Message]]:
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="tierfs/records.proto", package="tierfs", syntax="proto3"
    )
    for message_name, fields in _SCHEMA.items():
        message = file_proto.message_type.add(name=message_name)
        for number, (field_name, type_name, repeated) in enumerate(fields, start=1):
            message.field.add(
                name=field_name,
                number=number,
                type=_SCALARS[type_name],
                label=_T.LABEL_REPEATED if repeated else _T.LABEL_OPTIONAL,
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    file_descriptor = pool.FindFileByName(file_proto.name)
    return {
        name: message_factory.GetMessageClass(file_descriptor.message_types_by_name[name])
        for name in _SCHEMA
    }


_CLASSES = _build()
StoreRecord = _CLASSES["StoreRecord"]
DirectoryRecord = _CLASSES["DirectoryRecord"]
SegmentRecord = _CLASSES["SegmentRecord"]
ChunkRecord = _CLASSES["ChunkRecord"]
OffloadIndex = _CLASSES["OffloadIndex"]

_VERSION_FIELD = "version"
# message name -> its fields other than version, in field-number order: (name, repeated)
_VALUE_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {
    message_name: tuple(
        (field_name, repeated) for field_name, _, repeated in fields if field_name != _VERSION_FIELD
    )
    for message_name, fields in _SCHEMA.items()
}
# message name -> (reads those fields off a message in one call, positions of repeated ones)
_READERS: dict[str, tuple[Callable[[Message], tuple[Any, ...]], tuple[int, ...]]] = {
    message_name: (
        operator.attrgetter(*(name for name, _ in fields)),
        tuple(i for i, (_, repeated) in enumerate(fields) if repeated),
    )
    for message_name, fields in _VALUE_FIELDS.items()
}


class RecordVersionError(ValueError):
    """A stored record was written by a newer tierfs than this one."""


def decode(cls: type[Message], data: bytes) -> Message:
    """The ``cls`` message in ``data``; ``RecordVersionError`` if it is too new."""
    record = cls.FromString(data)
    version = int(getattr(record, _VERSION_FIELD))
    if version > RECORD_VERSION:
        raise RecordVersionError(
            f"{cls.DESCRIPTOR.name} version {version} is newer than "
            f"this tierfs understands ({RECORD_VERSION}); upgrade tierfs"
        )
    return record


def encode(record: Message) -> bytes:
    """``record``'s bytes, stamped with ``RECORD_VERSION``."""
    setattr(record, _VERSION_FIELD, RECORD_VERSION)
    return record.SerializeToString()


# ------------------------------------------------------------------ typed values
class RecordValue(Protocol):
    """A frozen dataclass with the fields of the message named ``MESSAGE``, in the
    message's order."""

    MESSAGE: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


V = TypeVar("V", bound=RecordValue)


def check_value_type(cls: type[RecordValue]) -> None:
    """Fail at import if ``cls`` does not have exactly its message's fields, in order
    (``load`` passes them by position)."""
    expected = [name for name, _ in _VALUE_FIELDS[cls.MESSAGE]]
    actual = [field.name for field in dataclasses.fields(cls)]
    if actual != expected:
        raise TypeError(f"{cls.__name__} has fields {actual}, {cls.MESSAGE} has {expected}")


def load(cls: type[V], data: bytes) -> V:
    """The value of type ``cls`` stored in ``data`` (``RecordVersionError`` if a newer
    tierfs wrote it; protobuf's ``DecodeError`` if it is not a record)."""
    read_fields, repeated = _READERS[cls.MESSAGE]
    values = read_fields(decode(_CLASSES[cls.MESSAGE], data))
    if not repeated:
        return cls(*values)
    listed = list(values)
    for i in repeated:
        listed[i] = tuple(listed[i])
    return cls(*listed)


def dump(value: RecordValue) -> bytes:
    """The stored form of ``value``, stamped with ``RECORD_VERSION``."""
    message = _CLASSES[value.MESSAGE]()
    for name, repeated in _VALUE_FIELDS[value.MESSAGE]:
        if repeated:
            getattr(message, name).extend(getattr(value, name))
        else:
            setattr(message, name, getattr(value, name))
    return encode(message)
