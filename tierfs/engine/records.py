"""Protobuf records persisted in the metadata database.

The message types are declared here in Python (a ``FileDescriptorProto``) instead of a
generated ``_pb2`` module, so no protoc run is needed to build tierfs. The wire format
is ordinary proto3, readable by any protobuf implementation given the same schema.

Invariants:
- Every record has ``version`` as field 1; readers reject versions newer than
  ``RECORD_VERSION`` instead of misreading them.
- Field numbers are never reused; new fields get new numbers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

RECORD_VERSION = 1

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


def _build() -> dict[str, Any]:
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
StoreRecord: Any = _CLASSES["StoreRecord"]
DirectoryRecord: Any = _CLASSES["DirectoryRecord"]
SegmentRecord: Any = _CLASSES["SegmentRecord"]
ChunkRecord: Any = _CLASSES["ChunkRecord"]
OffloadIndex: Any = _CLASSES["OffloadIndex"]


class RecordVersionError(ValueError):
    """A stored record was written by a newer tierfs than this one."""


def decode(cls: Any, data: bytes) -> Any:
    record = cls.FromString(data)
    if record.version > RECORD_VERSION:
        raise RecordVersionError(
            f"{cls.DESCRIPTOR.name} version {record.version} is newer than "
            f"this tierfs understands ({RECORD_VERSION}); upgrade tierfs"
        )
    return record


def encode(record: Any) -> bytes:
    record.version = RECORD_VERSION
    data: bytes = record.SerializeToString()
    return data
