"""The scan recovery runs over the journal files (format: ``journal.frames``).

Invariants:
- ``scan`` yields the valid append and create frames in LSN order and stops at the first frame
  that is short, fails its CRC or breaks the sequence.
- Corruption is never taken for a torn tail. Before the scan cuts at a bad frame it looks
  for whole frames after it (``_evidence_after``: the next frame boundary, else a search
  for the sequence numbers that must follow). If one of them was queued when the bad
  frame's bytes were already synced (its ``synced_lsn`` is past them), those bytes were
  once whole on disk: the scan raises ``JournalDamagedError`` naming the file and
  offset, and nothing is cut. Otherwise the bad frame is a torn tail: what follows was
  never synced (a power loss may write later pages before earlier ones) and never
  acknowledged as durable, so it is cut off (``ScanResult.cut``), and files after a cut
  or a gap between files are dropped (``ScanResult.dropped_files``).
- Padding frames (``fsck --repair``) are stepped over and keep the sequence going.
- Memory is bounded by ``READ_PIECE_BYTES`` plus the largest frame, whatever the size
  of a file or of the journal: each file is read in pieces, and only the frame being
  yielded is copied out of the read buffer.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import JournalCorruptionError
from tierfs.engine.journal.frames import (
    APPEND_HEADER,
    APPEND_V1_HEADER,
    APPEND_V2_HEADER,
    CREATE_HEADER,
    FRAME_HEADER,
    KIND_APPEND,
    KIND_APPEND_V1,
    KIND_APPEND_V2,
    KIND_CREATE,
    KIND_PADDING,
    MIN_PAYLOAD_BYTES,
    PADDING_HEADER,
    SEQ,
    DamagedStretch,
    ReplayedAppend,
    ReplayedCreate,
    ScanResult,
    append_header_size,
)

ReplayedFrame = ReplayedAppend | ReplayedCreate

# One read(2) of a journal file during recovery: large enough that the per-read cost is
# noise next to the CRC of the bytes, small enough that recovery's buffer is a rounding
# error next to the tail memory budget.
READ_PIECE_BYTES = 4 << 20
# How many frames a damaged stretch may swallow and still be found by the sequence
# numbers that follow it (one flipped bit swallows one; a bad sector a few dozen).
MAX_DAMAGED_FRAMES = 1 << 16


class JournalDamagedError(JournalCorruptionError):
    """A journal file holds a damaged stretch with intact frames after it (see the
    module's invariants): the store must not open over it."""

    def __init__(self, stretch: DamagedStretch) -> None:
        self.stretch = stretch
        super().__init__(f"{stretch.describe()}: this is corruption, not a torn tail; nothing was cut. "
                         "Run `tierfs fsck --repair` to move the damaged bytes to lost+found and keep every "
                         "intact frame")


class _Padding:
    """A padding frame: stepped over, it only carries the sequence on."""

    def __init__(self, seq: int, end_lsn: int) -> None:
        self.seq = seq
        self.end_lsn = end_lsn


class _PieceReader:
    """A window over one file: ``ensure(position, n)`` makes bytes ``[position,
    position + n)`` available in ``buffer`` (at ``position - start``), dropping what lies
    before ``position`` (reading forward is the usual case; a position outside the
    window starts a new one there)."""

    def __init__(self, f: io.BufferedReader) -> None:
        self._f = f
        self.buffer = bytearray()
        self.start = 0  # file offset of buffer[0]

    def ensure(self, position: int, length: int) -> bool:
        """False when the file ends before ``position + length``."""
        end = position + length
        if self.start <= position and end <= self.start + len(self.buffer):
            return True
        if not self.start <= position <= self.start + len(self.buffer):
            self.buffer.clear()
            self._f.seek(position)
            self.start = position
        del self.buffer[: position - self.start]  # at most one partial frame remains
        self.start = position
        missing = max(end - position, READ_PIECE_BYTES) - len(self.buffer)
        piece = self._f.read(missing)
        self.buffer += piece
        return self.start + len(self.buffer) >= end


def scan(
    files: list[tuple[int, Path]], max_payload_bytes: int, result: ScanResult
) -> Iterator[ReplayedFrame]:
    """Yield every valid append and create frame in ``files`` in order; fill ``result``.

    ``result.end_lsn`` must hold the LSN to assume when there are no files.
    """
    expected_seq: int | None = None
    for index, (start_lsn, path) in enumerate(files):
        if index > 0 and start_lsn != result.end_lsn:
            # A gap between files: the earlier file lost its tail. Nothing after the gap
            # was durable (files are synced in order), so everything from here is cut.
            result.dropped_files.extend(p for _, p in files[index:])
            return
        with open(path, "rb") as f:
            size = path.stat().st_size
            reader = _PieceReader(f)
            position = 0
            while position < size:
                frame = _frame_at(reader, position, max_payload_bytes, expected_seq, start_lsn)
                if frame is None:
                    break
                expected_seq = frame.seq + 1
                position = frame.end_lsn - start_lsn
                if not isinstance(frame, _Padding):
                    yield frame
        result.end_lsn = start_lsn + position
        if expected_seq is not None:
            result.next_seq = expected_seq
        if position < size:
            damage, unsynced = _evidence_after(files, index, position, expected_seq, max_payload_bytes)
            if damage is not None:
                raise JournalDamagedError(damage)
            result.cut = (path, position)
            result.unsynced_frames_dropped = unsynced
            result.dropped_files.extend(p for _, p in files[index + 1 :])
            return


def _evidence_after(
    files: list[tuple[int, Path]], index: int, position: int, expected_seq: int | None, max_payload_bytes: int
) -> tuple[DamagedStretch | None, int]:
    """Whole frames after the bad one at ``position`` of ``files[index]``: the damaged
    stretch if one of them proves the bad bytes were synced, and how many whole frames
    follow (all unsynced when there is no proof)."""
    bad_path = files[index][1]
    bad_lsn = files[index][0] + position
    whole = 0
    stretch_end: int | None = None  # where the damage ends in the bad file
    seq_after: int | None = None  # the sequence number of the first whole frame after it
    for file_index in range(index, len(files)):
        start_lsn, path = files[file_index]
        with open(path, "rb") as f:
            size = path.stat().st_size
            reader = _PieceReader(f)
            resume_seq: int | None = None
            if file_index == index:
                found = _next_whole_frame(reader, position, size, expected_seq, max_payload_bytes, start_lsn)
                if found is None:
                    continue
                at, resume_seq = found
                stretch_end, seq_after = at, resume_seq
            else:
                at = 0
                if stretch_end is None:
                    stretch_end = bad_path.stat().st_size
            while at < size:
                frame = _frame_at(reader, at, max_payload_bytes, resume_seq, start_lsn)
                if frame is None:
                    break
                if seq_after is None:
                    seq_after = frame.seq
                whole += 1
                if isinstance(frame, ReplayedAppend) and frame.synced_lsn > bad_lsn:
                    last_seq = seq_after - 1
                    first_seq = expected_seq if expected_seq is not None else last_seq
                    return DamagedStretch(bad_path, position, stretch_end, bad_lsn, first_seq, last_seq), whole
                resume_seq = frame.seq + 1
                at = frame.end_lsn - start_lsn
    return None, whole


def _next_whole_frame(
    reader: _PieceReader, bad: int, size: int, expected_seq: int | None, max_payload_bytes: int, start_lsn: int
) -> tuple[int, int] | None:
    """(file offset, seq) of the first whole frame after the bad frame at ``bad``: at the
    boundary its header gives, else the first place where a frame with one of the next
    ``MAX_DAMAGED_FRAMES`` sequence numbers validates."""
    if reader.ensure(bad, FRAME_HEADER.size):
        payload_len = FRAME_HEADER.unpack_from(reader.buffer, bad - reader.start)[0]
        boundary = bad + FRAME_HEADER.size + payload_len
        if payload_len <= max_payload_bytes and boundary < size:
            frame = _frame_at(reader, boundary, max_payload_bytes, None, start_lsn)
            if frame is not None and (expected_seq is None or expected_seq < frame.seq <= expected_seq
                                      + MAX_DAMAGED_FRAMES):
                return boundary, frame.seq
    if expected_seq is None:
        return None  # the journal's first frame: no sequence to look for
    # The 6 high bytes of the sequence numbers that may follow: at most two patterns.
    patterns = {SEQ.pack(seq)[2:] for seq in (expected_seq, expected_seq + MAX_DAMAGED_FRAMES)}
    at = bad + 1
    while at + FRAME_HEADER.size <= size:
        if not reader.ensure(at, min(READ_PIECE_BYTES, size - at)):
            return None
        window = bytes(reader.buffer[at - reader.start:])
        hits = sorted(h for pattern in patterns for h in _find_all(window, pattern))
        for hit in hits:
            candidate = at + hit - 10  # the pattern is bytes 10..16 of a frame header
            if candidate <= bad:
                continue
            if not reader.ensure(candidate, FRAME_HEADER.size):
                return None
            seq = FRAME_HEADER.unpack_from(reader.buffer, candidate - reader.start)[2]
            if not expected_seq < seq <= expected_seq + MAX_DAMAGED_FRAMES:
                continue
            if _frame_at(reader, candidate, max_payload_bytes, seq, start_lsn) is not None:
                return candidate, seq
        at += max(1, len(window) - FRAME_HEADER.size)
    return None


def _find_all(window: bytes, pattern: bytes) -> Iterator[int]:
    at = window.find(pattern)
    while at >= 0:
        yield at
        at = window.find(pattern, at + 1)


def _frame_at(
    reader: _PieceReader, position: int, max_payload_bytes: int, expected_seq: int | None, start_lsn: int
) -> ReplayedFrame | _Padding | None:
    """The valid frame at file offset ``position``, or None (torn or foreign)."""
    if not reader.ensure(position, FRAME_HEADER.size):
        return None
    offset_in_buffer = position - reader.start
    payload_len, crc, seq = FRAME_HEADER.unpack_from(reader.buffer, offset_in_buffer)
    if payload_len < MIN_PAYLOAD_BYTES or payload_len > max_payload_bytes:
        return None
    if expected_seq is not None and seq != expected_seq:
        return None
    if not reader.ensure(position, FRAME_HEADER.size + payload_len):
        return None
    header_end = position - reader.start + FRAME_HEADER.size
    payload_end = header_end + payload_len
    with memoryview(reader.buffer) as view:  # released before the buffer is resized
        payload = view[header_end:payload_end]
        if crc32c(payload, crc32c(SEQ.pack(seq))) != crc:
            return None
        kind = payload[0]
        frame_end = position + FRAME_HEADER.size + payload_len
        if kind == KIND_CREATE and payload_len >= CREATE_HEADER.size:
            create = _create_frame(payload, seq, start_lsn + position, start_lsn + frame_end)
            payload.release()
            return create
        if kind == KIND_PADDING and payload_len >= PADDING_HEADER.size:
            first_seq = PADDING_HEADER.unpack_from(payload)[1]
            payload.release()
            if expected_seq is not None and first_seq != expected_seq:
                return None
            return _Padding(seq, start_lsn + frame_end)
        synced_lsn = writer = writer_seq = 0
        if kind == KIND_APPEND and payload_len >= APPEND_HEADER.size:
            _, segment_id, offset, wall_ns, synced_lsn, writer, writer_seq = APPEND_HEADER.unpack_from(payload)
        elif kind == KIND_APPEND_V2 and payload_len >= APPEND_V2_HEADER.size:
            _, segment_id, offset, wall_ns = APPEND_V2_HEADER.unpack_from(payload)
        elif kind == KIND_APPEND_V1 and payload_len >= APPEND_V1_HEADER.size:
            _, segment_id, offset = APPEND_V1_HEADER.unpack_from(payload)
            wall_ns = 0
        else:
            return None
        data = bytes(payload[append_header_size(kind) :])
        payload.release()
    return ReplayedAppend(
        seq=seq,
        frame_lsn=start_lsn + position,
        segment_id=segment_id,
        offset=offset,
        data=data,
        end_lsn=start_lsn + frame_end,
        wall_ns=wall_ns,
        synced_lsn=synced_lsn,
        writer=writer,
        writer_seq=writer_seq,
    )


def _create_frame(payload: memoryview, seq: int, frame_lsn: int, end_lsn: int) -> ReplayedCreate | None:
    """A create frame's contents (None if they do not parse: treated as torn)."""
    _, segment_id, record_len = CREATE_HEADER.unpack_from(payload)
    record_end = CREATE_HEADER.size + record_len
    if record_end >= len(payload):
        return None
    try:
        name = bytes(payload[record_end:]).decode()
    except UnicodeDecodeError:
        return None
    return ReplayedCreate(seq, frame_lsn, segment_id, name, bytes(payload[CREATE_HEADER.size:record_end]), end_lsn)
