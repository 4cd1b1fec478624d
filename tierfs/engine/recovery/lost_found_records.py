"""What a lost+found entry holds, as appends to make again (``tierfs lost-found restore``).

- A saved range (``<segment>.e<epoch>``, ``<segment>.journal-<LSN>``): its bytes, cut at
  the appends its description names with their writer identities (each sent again
  with its identity, so an owner that holds it already answers without appending it
  twice) and, between them, in pieces of at most ``PIECE_BYTES`` without one.
- A container's data dir (``cNNN.lease-<epoch>/``): every intact journal frame of a
  segment its ``LOST.json`` names, above the length that was flushed when it was set
  aside, with the frame's writer identity if it has one.
- Damaged journal bytes (``*.damaged``) are never appended: they failed their check.

Invariants: bytes are read in bounded pieces (a frame, or ``PIECE_BYTES``); nothing here
writes; a piece is never cut inside an identified append.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.writers import WriterSeq
from tierfs.engine.journal.frames import ReplayedAppend, ScanResult, list_files
from tierfs.engine.journal.scan import scan
from tierfs.engine.recovery.lost_found import LostFoundEntry

PIECE_BYTES = 16 << 20  # an unidentified stretch is appended in records of at most this size
MAX_FRAME_BYTES = 1 << 30  # a frame of a journal set aside is read whole (max_append_bytes is below it)


@dataclasses.dataclass(frozen=True)
class Piece:
    segment: str
    data: bytes
    writer: WriterSeq | None


def pieces(data_dir: Path, entry: LostFoundEntry) -> Iterator[Piece]:
    """The appends ``entry`` holds, in order (see the module docstring)."""
    path = data_dir / entry.path
    facts: dict[str, Any] = dict(entry.description or {})
    if path.is_dir():
        yield from _journal_pieces(path, facts)
        return
    if path.name.endswith(".damaged"):
        raise InvalidArgumentError(f"{entry.path} holds damaged journal bytes that failed their check: they are "
                                   "not appended; read them yourself, then remove the entry")
    if not entry.segment or "start_offset" not in facts:
        raise InvalidArgumentError(f"{entry.path} has no description naming its segment and offsets")
    yield from _range_pieces(path, entry.segment, int(facts["start_offset"]), facts.get("writers") or [])


def _range_pieces(path: Path, segment: str, start: int, writers: list[Any]) -> Iterator[Piece]:
    identified = sorted((int(offset), int(length), WriterSeq(int(writer, 16), int(seq)))
                        for writer, seq, offset, length in writers)
    size = path.stat().st_size
    with open(path, "rb") as f:
        position = 0  # in the file
        for offset, length, writer in identified:
            at = offset - start
            if at < position or at + length > size:
                continue  # overlapping or beyond what was saved: its bytes go as unidentified ones
            yield from _plain(f, segment, position, at)
            f.seek(at)
            yield Piece(segment, f.read(length), writer)
            position = at + length
        yield from _plain(f, segment, position, size)


def _plain(f: Any, segment: str, start: int, end: int) -> Iterator[Piece]:
    f.seek(start)
    while start < end:
        data = f.read(min(PIECE_BYTES, end - start))
        if not data:
            return
        yield Piece(segment, data, None)
        start += len(data)


def _journal_pieces(directory: Path, facts: dict[str, Any]) -> Iterator[Piece]:
    named: dict[str, Any] = facts.get("segments") or {}
    if not named:
        raise InvalidArgumentError(f"{directory.name}: its LOST.json names no segments (it was set aside at a "
                                   "start, before they were known); its journal holds them by segment id only")
    files = list_files(directory / "journal") if (directory / "journal").is_dir() else []
    result = ScanResult(end_lsn=files[0][0] if files else 0, next_seq=1)
    for frame in scan(files, MAX_FRAME_BYTES, result):
        if not isinstance(frame, ReplayedAppend):
            continue
        known = named.get(str(frame.segment_id))
        if known is None or frame.offset + len(frame.data) <= int(known.get("flushed", 0)):
            continue  # another segment's, or in tier-2 already
        skip = max(0, int(known.get("flushed", 0)) - frame.offset)
        writer = WriterSeq(frame.writer, frame.writer_seq) if frame.writer and not skip else None
        yield Piece(str(known["name"]), frame.data[skip:], writer)
