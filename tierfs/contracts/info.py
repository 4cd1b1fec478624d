"""Value types every front end and client sees: what ``stat`` and ``ls`` return.

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
    type: str = "segment"


@dataclasses.dataclass(frozen=True)
class DirectoryInfo:
    name: str
    created: float
    type: str = "directory"


Info = SegmentInfo | DirectoryInfo


def info_json(info: Info) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_json(data: dict[str, Any]) -> Info:
    if data.get("type") == "directory":
        return DirectoryInfo(name=data["name"], created=data["created"])
    return SegmentInfo(**data)
