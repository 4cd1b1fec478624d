"""Value types every front end and client sees: what ``stat`` and ``ls`` return.

Times: ``*_ns`` are exact nanoseconds since the epoch (the FUSE mount uses them);
``created``/``modified`` are the same instants in float seconds. A segment's mtime is the
time of its last acknowledged append within the durable length, or the last explicit
set; it never moves without one (no flush, offload, restart or stat moves it).
``mode`` holds the permission bits as every front end reports them (a sealed segment
has no write bit); ``uid``/``gid`` are the stored owner, else the daemon's.

These are plain frozen dataclasses with no behaviour, shared by the engine, the HTTP
API, the remote client, the FUSE mount, the fsspec plugin and Spark, so a client never
imports the engine to name them. ``info_json``/``info_from_json`` are their wire form.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    name: str
    segment_id: int
    length: int  # durable length: what ordinary readers see
    durable_length: int
    appended_length: int
    flushed_length: int
    sealed: bool
    durability: str
    chunk_count: int
    created: float  # seconds since the epoch
    modified: float
    start_offset: int = 0  # retention deleted the bytes below it
    mtime_ns: int = 0
    atime_ns: int = 0
    ctime_ns: int = 0
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    type: str = "segment"


@dataclasses.dataclass(frozen=True)
class DirectoryInfo:
    name: str
    created: float
    modified: float = 0.0  # entries added, removed or renamed, or the last set
    mtime_ns: int = 0
    atime_ns: int = 0
    ctime_ns: int = 0
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    subdirectories: int = 0  # directories directly inside it (st_nlink = 2 + this)
    type: str = "directory"
    directory_id: int = 0  # its identity for its whole life (0: the root)


Info = SegmentInfo | DirectoryInfo


def info_json(info: Info) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_json(data: dict[str, Any]) -> Info:
    if data.get("type") == "directory":
        return DirectoryInfo(**{k: v for k, v in data.items() if k in _DIRECTORY_FIELDS})
    return SegmentInfo(**{k: v for k, v in data.items() if k in _SEGMENT_FIELDS})


# a newer daemon may send fields this client does not know: they are left out
_DIRECTORY_FIELDS = frozenset(f.name for f in dataclasses.fields(DirectoryInfo))
_SEGMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(SegmentInfo))
