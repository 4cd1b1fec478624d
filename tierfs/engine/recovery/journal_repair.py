"""``tierfs fsck --repair`` of a damaged journal: the damage goes to lost+found, every
intact frame stays.

Recovery refuses a journal with a damaged stretch that intact frames follow
(``journal.scan.JournalDamagedError``: corruption, not a torn tail). Repair, asked for
by ``StoreConfig.repair_journal``, does two things while recovery replays:

1. ``take_out_stretch``: the damaged bytes are copied to
   ``lost+found/journal/<file>@<offset>.damaged`` (with a ``.json`` description: the
   file, offset, LSN and sequence numbers, and the segment and offset its header names,
   unverified) and replaced in place by one padding frame of the same length, which
   carries the sequence on. LSNs never move, so nothing that refers to one changes.
2. ``take_out_frame``: a segment whose frame was in the damaged stretch now has a gap:
   its intact frames after the gap cannot follow it. Each is copied, whole and
   CRC-checked, to ``lost+found/<segment>.journal-<LSN of the first>`` (one entry per
   segment and gap, with its offsets and writers: ``tierfs lost-found restore``
   appends it again) and replaced by padding too.

Invariants:
- A damaged stretch or frame is copied and fsynced (data, then description) before its
  bytes in the journal are overwritten, and the overwrite is fsynced before recovery
  goes on: a crash at any point leaves either the damage in place (the next repair
  finds it again) or its copy in lost+found.
- Frames of other segments, and the damaged segment's frames before the gap, replay
  where they were: only the damaged bytes, and what cannot follow them, move.
- Nothing is deleted: lost+found keeps every byte until someone restores or removes it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from tierfs.blocks.checksums import crc32c
from tierfs.engine.journal.frames import (
    APPEND_V1_HEADER,
    FRAME_HEADER,
    DamagedStretch,
    ReplayedAppend,
    encode_padding,
)
from tierfs.engine.recovery.lost_found import LOST_FOUND_DIR, write_description, write_piece

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _GapEntry:
    path: Path
    description: dict[str, object]
    bytes: int = 0
    crc: int = 0


class JournalRepair:
    """The lost+found side of a journal repair (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._gaps: dict[int, _GapEntry] = {}  # segment id -> the entry its frames go to
        self.stretches = 0
        self.frames_moved = 0

    def take_out_stretch(self, stretch: DamagedStretch) -> None:
        """Copy the damaged bytes to lost+found, then overwrite them with padding."""
        length = stretch.end - stretch.start
        with open(stretch.path, "rb") as f:
            damaged = os.pread(f.fileno(), length, stretch.start)
        target = self._data_dir / LOST_FOUND_DIR / "journal" / f"{stretch.path.name}@{stretch.start}.damaged"
        description: dict[str, object] = {
            "why": "damaged journal bytes (a later frame proves they were once synced whole); "
                   "their header, if readable, is below, unverified",
            "journal_file": stretch.path.name, "file_offset": stretch.start, "lsn": stretch.start_lsn,
            "bytes": length, "first_seq": stretch.first_seq, "last_seq": stretch.last_seq,
        }
        if length >= FRAME_HEADER.size + APPEND_V1_HEADER.size:
            kind, segment_id, offset = APPEND_V1_HEADER.unpack_from(damaged, FRAME_HEADER.size)
            description["header_says"] = {"kind": kind, "segment_id": segment_id, "offset": offset}
        write_piece(target, 0, damaged)
        write_description(target, description)
        self._overwrite(stretch.path, stretch.start,
                        encode_padding(stretch.first_seq, stretch.last_seq, length))
        self.stretches += 1
        log.error("journal repair: %s: %d damaged bytes saved to %s", stretch.describe(), length, target)

    def take_out_frame(self, frame: ReplayedAppend, path: Path, file_start_lsn: int, segment_name: str,
                       expected_offset: int) -> None:
        """Move one intact frame that cannot follow the gap of its segment (it starts at
        ``frame.offset``, the segment ends at ``expected_offset``) into the segment's
        lost+found entry, then overwrite it with padding."""
        entry = self._gaps.get(frame.segment_id)
        if entry is None:
            name = f"{segment_name}.journal-{frame.frame_lsn:020d}"
            entry = _GapEntry(self._data_dir / LOST_FOUND_DIR / name, {
                "why": "intact appends after damaged journal bytes: they cannot follow the gap "
                       f"{expected_offset}..{frame.offset} (tierfs lost-found restore appends them at the end)",
                "segment": segment_name, "segment_id": frame.segment_id, "start_offset": frame.offset,
                "missing_from_offset": expected_offset, "writers": [],
            })
            self._gaps[frame.segment_id] = entry
        description = entry.description
        if frame.offset != int(str(description["start_offset"])) + entry.bytes:
            log.warning("journal repair: frame seq %d of segment %d is not contiguous with the ones before it",
                        frame.seq, frame.segment_id)
        write_piece(entry.path, entry.bytes, frame.data)
        entry.bytes += len(frame.data)
        entry.crc = crc32c(frame.data, entry.crc)
        writers = description["writers"]
        assert isinstance(writers, list)
        if frame.writer:
            writers.append([f"{frame.writer:016x}", frame.writer_seq, frame.offset, len(frame.data)])
        description.update({"end_offset": frame.offset + len(frame.data), "bytes": entry.bytes,
                            "crc32c": entry.crc})
        write_description(entry.path, description)
        frame_bytes = frame.end_lsn - frame.frame_lsn
        self._overwrite(path, frame.frame_lsn - file_start_lsn, encode_padding(frame.seq, frame.seq, frame_bytes))
        self.frames_moved += 1

    @staticmethod
    def _overwrite(path: Path, position: int, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, position)
            os.fsync(fd)
        finally:
            os.close(fd)
