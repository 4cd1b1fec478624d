"""What ``stat``, ``ls`` and the chunk layout report: value types built from the
in-memory state, with no metadata round trip.

Invariant: a segment's reported length is its durable length (LAC); the appended and
flushed lengths are reported beside it, never instead of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from tierfs.contracts import names
from tierfs.contracts.info import Info, SegmentInfo
from tierfs.engine.record_types import Chunk
from tierfs.engine.segment_state import SegmentState
from tierfs.engine.segment_table import SegmentTable
from tierfs.store.attributes import directory_info, segment_info

__all__ = ["chunk_layout", "list_directory", "segment_info", "stat", "walk_segments"]


async def stat(table: SegmentTable, name: str) -> Info:
    table.check_open()
    canonical = names.canonical(name, allow_root=True)
    await trio.lowlevel.checkpoint()
    if canonical == "" or canonical in table.directories:
        return directory_info(canonical, table.directory_record(canonical), table.subdirectories_of(canonical))
    return segment_info(table.segment(canonical))


async def list_directory(table: SegmentTable, name: str) -> list[Info]:
    """Entries directly inside a directory, sorted by name."""
    table.check_open()
    directory = names.canonical(name, allow_root=True)
    table.require_directory(directory)
    await trio.lowlevel.checkpoint()
    result: list[Info] = []
    for entry_name in table.children_of(directory):  # sorted, and only this directory's
        if names.is_unlinked_leftover(entry_name):
            continue  # unlinked, kept only for the mount's open descriptors
        record = table.directories.get(entry_name)
        if record is not None:
            result.append(directory_info(entry_name, record, table.subdirectories_of(entry_name)))
        else:
            result.append(segment_info(table.by_name[entry_name]))
    return result


async def walk_segments(table: SegmentTable) -> list[SegmentInfo]:
    await trio.lowlevel.checkpoint()
    return [segment_info(s) for s in sorted(table.segments(), key=lambda s: s.name)]


def chunk_layout(
    seg: SegmentState, chunks: list[Chunk], chunk_url: Callable[[str], str]
) -> list[dict[str, Any]]:
    """Chunks of a segment for direct readers: name, URL, segment offset range, CRCs."""
    return [
        {
            "name": c.name,
            "url": c.location or chunk_url(c.name),
            "start": c.start_offset,
            "end": c.start_offset + c.length,
            "crc32c": c.crc32c,
            "block_crc32c": list(c.block_crc32c),
            "epoch": c.epoch,
            "segment_id": seg.segment_id,
            "offloaded": bool(c.location),  # "" = in the chunk store
        }
        for c in chunks
    ]
