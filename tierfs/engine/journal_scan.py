"""The scan recovery runs over the journal files (format: ``journal_format``).

Invariants:
- ``scan`` yields the valid append and create frames in LSN order and stops at the first frame
  that is short, fails its CRC or breaks the sequence: nothing after it was ever
  acknowledged as durable, so it is cut off (``ScanResult.cut``), and files after a cut
  or a gap between files are dropped (``ScanResult.dropped_files``).
- Memory is bounded by ``READ_PIECE_BYTES`` plus the largest frame, whatever the size
  of a file or of the journal: each file is read in pieces, and only the frame being
  yielded is copied out of the read buffer.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

from tierfs.blocks.checksums import crc32c
from tierfs.engine.journal_format import (
    APPEND_HEADER,
    APPEND_V1_HEADER,
    CREATE_HEADER,
    FRAME_HEADER,
    KIND_APPEND,
    KIND_APPEND_V1,
    KIND_CREATE,
    SEQ,
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


class _PieceReader:
    """A forward-only window over one file: ``ensure(position, n)`` makes bytes
    ``[position, position + n)`` available in ``buffer`` (at ``position - start``),
    dropping what lies before ``position``."""

    def __init__(self, f: io.BufferedReader) -> None:
        self._f = f
        self.buffer = bytearray()
        self.start = 0  # file offset of buffer[0]

    def ensure(self, position: int, length: int) -> bool:
        """False when the file ends before ``position + length``."""
        end = position + length
        if end <= self.start + len(self.buffer):
            return True
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
                yield frame
        result.end_lsn = start_lsn + position
        if expected_seq is not None:
            result.next_seq = expected_seq
        if position < size:
            result.cut = (path, position)
            result.dropped_files.extend(p for _, p in files[index + 1 :])
            return


def _frame_at(
    reader: _PieceReader, position: int, max_payload_bytes: int, expected_seq: int | None, start_lsn: int
) -> ReplayedFrame | None:
    """The valid frame at file offset ``position``, or None (torn or foreign)."""
    if not reader.ensure(position, FRAME_HEADER.size):
        return None
    offset_in_buffer = position - reader.start
    payload_len, crc, seq = FRAME_HEADER.unpack_from(reader.buffer, offset_in_buffer)
    if payload_len < CREATE_HEADER.size or payload_len > max_payload_bytes:
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
        if kind == KIND_CREATE:
            create = _create_frame(payload, seq, start_lsn + position, start_lsn + frame_end)
            payload.release()
            return create
        if kind == KIND_APPEND and payload_len >= APPEND_HEADER.size:
            _, segment_id, offset, wall_ns = APPEND_HEADER.unpack_from(payload)
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
