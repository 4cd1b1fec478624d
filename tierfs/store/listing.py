"""What ``stat``, ``ls`` and the chunk layout report: value types built from a
segment's state in memory, or from its metadata row when nothing holds it in memory.

Invariant: a segment's reported length is its durable length (LAC); the appended and
flushed lengths are reported beside it, never instead of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from tierfs.contracts import names
from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.store.attributes import directory_info, segment_info

__all__ = ["chunk_layout", "list_directory", "segment_info", "stat", "walk_segments"]


async def stat(table: SegmentTable, name: str) -> Info:
    table.check_open()
    canonical = names.canonical(name, allow_root=True)
    await trio.lowlevel.checkpoint()
    if canonical == "" or canonical in table.directories:
        return directory_info(canonical, table.directory_record(canonical), table.subdirectories_of(canonical))
    found = table.row_or_state(canonical)  # no state is made for a segment nobody uses
    if found is None:  # one lookup answers a miss: a name the kernel asks about before creating it
        raise SegmentNotFoundError(canonical)
    return segment_info(found)


async def list_directory(table: SegmentTable, name: str) -> list[Info]:
    """Entries directly inside a directory, sorted by name: its subdirectories from
    memory, its segments with one metadata query (or from memory where loaded)."""
    table.check_open()
    directory = names.canonical(name, allow_root=True)
    table.require_directory(directory)
    await trio.lowlevel.checkpoint()
    entries: list[Info] = [directory_info(d, table.directories[d], table.subdirectories_of(d))
                           for d in table.subdirectory_names(directory)]
    entries += [segment_info(found) for found in table.segments_in(directory)]
    entries.sort(key=lambda info: info.name)
    return entries


async def walk_segments(table: SegmentTable) -> list[SegmentInfo]:
    """Every segment, by name (a walk of the whole store: O(segments)); detached ones
    (held by descriptors after their deletion) are nobody's name."""
    await trio.lowlevel.checkpoint()
    return [segment_info(found) for found in table.walk() if not names.is_detached(found.name)]


def chunk_layout(
    seg: SegmentState, chunks: list[Chunk], chunk_url: Callable[[str], str]
) -> list[dict[str, Any]]:
    """Chunks of a segment for direct readers: name, URL, segment offset range, CRCs,
    and where the chunk starts in the object (``object_offset``: a chunk packed with
    others; 0 for an offloaded one, whose long-term object holds it alone)."""
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
            "object_offset": 0 if c.location else c.object_offset,
        }
        for c in chunks
    ]
