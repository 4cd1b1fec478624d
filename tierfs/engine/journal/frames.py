"""Tier-1 journal format: CRC-framed append records in files named by LSN, written with
writev and read back by LSN, CRC-checked (the scan recovery runs is ``journal.scan``).

Frame layout (little endian)::

    payload_len:u32 | crc32c:u32 | seq:u64 | payload
    payload = kind:u8 (4 = append) | segment_id:u64 | offset:u64 | wall_ns:u64
              | synced_lsn:u64 | writer:u64 | writer_seq:u64 | data
            | kind:u8 (3 = create) | segment_id:u64 | record_len:u32 | record | name
            | kind:u8 (5 = padding) | first_seq:u64 | any bytes

``wall_ns`` is the append's wall-clock time (the segment's mtime once the bytes are
durable, also after a restart). ``synced_lsn`` is the journal's durable LSN when the
frame was queued (BookKeeper's piggybacked LAC): a frame that says an earlier LSN was
synced proves the bytes there were once whole, so damage there is corruption, never a
torn tail (``journal.scan``). ``writer``/``writer_seq`` name the append for
exactly-once retries (0: an anonymous append; ``segments.writer_marks``). Frames of kind 2
(no ``synced_lsn`` nor writer) and kind 1 (no ``wall_ns`` either), written by older
versions, still replay. A padding frame stands where ``tierfs fsck --repair`` took a
damaged stretch out (saved in lost+found), covering the sequence numbers from
``first_seq`` to its own, so the LSNs of the frames after it never move. A create frame
holds a segment's creation whose metadata commit was not synced (``record``: its
``SegmentRecord``, ``name``: UTF-8); recovery puts it back if the metadata lost it
(``metadata.replay``). A tierfs older than kind 3 stops its replay at such a frame.

The CRC covers the 8 sequence bytes and the payload. Every byte position in the journal
has a global *LSN* (log sequence number = bytes written since the store was created);
a file is named after the LSN of its first byte, so a file's end is the next file's start.

Invariants:
- ``write_all`` writes every byte of a batch or raises: a short write never leaves a
  frame half-acknowledged.
- ``verified_payloads`` hands out a frame's data only once its CRC32C matched.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import crc32c as _crc32c_module

from tierfs.contracts.errors import DataCorruptionError, JournalCorruptionError

FRAME_HEADER = struct.Struct("<IIQ")  # payload_len, crc32c, seq
SEQ = struct.Struct("<Q")
APPEND_V1_HEADER = struct.Struct("<BQQ")  # kind 1: kind, segment_id, offset
APPEND_V2_HEADER = struct.Struct("<BQQQ")  # kind 2: kind, segment_id, offset, wall_ns
# kind, segment_id, offset, wall_ns, synced_lsn, writer, writer_seq
APPEND_HEADER = struct.Struct("<BQQQQQQ")
KIND_APPEND_V1 = 1
KIND_APPEND_V2 = 2
KIND_CREATE = 3
KIND_APPEND = 4
KIND_PADDING = 5
CREATE_HEADER = struct.Struct("<BQI")  # kind, segment_id, record_len
PADDING_HEADER = struct.Struct("<BQ")  # kind, first_seq
FRAME_OVERHEAD = FRAME_HEADER.size + APPEND_HEADER.size
MIN_PAYLOAD_BYTES = min(CREATE_HEADER.size, PADDING_HEADER.size, APPEND_V1_HEADER.size)
FILE_SUFFIX = ".jnl"
_APPEND_KINDS = (KIND_APPEND, KIND_APPEND_V2, KIND_APPEND_V1)


_SEQ_AND_APPEND_HEADER = struct.Struct("<QBQQQQQQ")  # what the CRC covers before the data
_FULL_HEADER = struct.Struct("<IIQBQQQQQQ")  # FRAME_HEADER + APPEND_HEADER in one pack


def append_header_size(kind: int) -> int:
    """Bytes of the append header (before the data) in a frame of ``kind``."""
    if kind == KIND_APPEND:
        return APPEND_HEADER.size
    return APPEND_V1_HEADER.size if kind == KIND_APPEND_V1 else APPEND_V2_HEADER.size


def is_append(kind: int) -> bool:
    return kind in _APPEND_KINDS


# Bound once: this runs for every append, and the checksums module's wrapper (keyword
# argument, one more Python frame) costs more than the CRC of a 1 KiB record itself.
_raw_crc32c = _crc32c_module.crc32c
_pack_crc_input = _SEQ_AND_APPEND_HEADER.pack
_pack_full_header = _FULL_HEADER.pack
_APPEND_HEADER_BYTES = APPEND_HEADER.size


def encode_append_header(seq: int, segment_id: int, offset: int, data: bytes, wall_ns: int = 0,
                         synced_lsn: int = 0, writer: int = 0, writer_seq: int = 0) -> bytes:
    """The header of an append frame (its CRC covers ``data``); the data follows it."""
    crc = _raw_crc32c(data, _raw_crc32c(_pack_crc_input(
        seq, KIND_APPEND, segment_id, offset, wall_ns, synced_lsn, writer, writer_seq)))
    return _pack_full_header(_APPEND_HEADER_BYTES + len(data), crc, seq, KIND_APPEND, segment_id, offset,
                             wall_ns, synced_lsn, writer, writer_seq)


def encode_append(seq: int, segment_id: int, offset: int, data: bytes, wall_ns: int = 0,
                  synced_lsn: int = 0, writer: int = 0, writer_seq: int = 0) -> bytes:
    return encode_append_header(seq, segment_id, offset, data, wall_ns, synced_lsn, writer, writer_seq) + data


def encode_padding(first_seq: int, seq: int, frame_bytes: int) -> bytes:
    """A padding frame of exactly ``frame_bytes`` standing for sequence numbers
    ``first_seq`` to ``seq`` (``fsck --repair``, in place of a damaged stretch)."""
    payload = PADDING_HEADER.pack(KIND_PADDING, first_seq)
    payload += bytes(frame_bytes - FRAME_HEADER.size - len(payload))
    crc = _raw_crc32c(payload, _raw_crc32c(SEQ.pack(seq)))
    return FRAME_HEADER.pack(len(payload), crc, seq) + payload


def create_frame_bytes(name: bytes, record: bytes) -> int:
    return FRAME_HEADER.size + CREATE_HEADER.size + len(record) + len(name)


def encode_create(seq: int, segment_id: int, name: bytes, record: bytes) -> bytes:
    """A create frame: segment ``segment_id`` called ``name`` (UTF-8) with the stored
    ``record``; ``create_frame_bytes`` long."""
    payload = CREATE_HEADER.pack(KIND_CREATE, segment_id, len(record)) + record + name
    crc = _raw_crc32c(payload, _raw_crc32c(SEQ.pack(seq)))
    return FRAME_HEADER.pack(len(payload), crc, seq) + payload


def verified_payloads(raw: bytes, start_lsn: int, entries: Sequence[TailEntryLike]) -> list[bytes]:
    """The data of ``entries`` (frames that follow each other from ``start_lsn``, read
    into ``raw``), each frame's CRC32C checked; ``DataCorruptionError`` on a mismatch.

    Runs in a worker thread for every evicted append a flush re-reads, holding the GIL
    the event loop needs: so one pass with local names, no per-frame copies but the
    result."""
    view = memoryview(raw)
    unpack_header = FRAME_HEADER.unpack_from
    pack_seq = SEQ.pack
    header_bytes = FRAME_HEADER.size
    results = []
    for entry in entries:
        at = entry.frame_lsn - start_lsn
        end = entry.end_lsn - start_lsn
        if entry.frames != 1:
            results.append(_merged_entry_data(view, at, end, entry, start_lsn))
            continue
        payload_len, crc, seq = unpack_header(view, at)
        body = at + header_bytes
        if payload_len != end - body or _raw_crc32c(view[body:end], _raw_crc32c(pack_seq(seq))) != crc:
            raise DataCorruptionError(f"journal frame at LSN {entry.frame_lsn} failed its CRC32C check")
        data_at = body + append_header_size(raw[body])
        results.append(raw[data_at + entry.frame_skip : end])
    return results


def _merged_entry_data(view: memoryview, at: int, end: int, entry: TailEntryLike, start_lsn: int) -> bytes:
    """The data of an entry recovery merged: the frames in ``view[at:end]`` of the
    segment of its first frame, each CRC32C-checked, in offset order (other segments'
    frames in between are stepped over, a repeated range is taken once, a gap is
    corruption); ``entry.frame_skip`` bytes off the first, ``entry.length`` in all."""
    pieces: list[bytes | memoryview] = []
    segment_id = expected = -1
    while at < end:
        payload_len, crc, seq = FRAME_HEADER.unpack_from(view, at)
        body = at + FRAME_HEADER.size
        frame_end = body + payload_len
        if frame_end > end:
            raise DataCorruptionError(f"journal frame at LSN {start_lsn + at} runs past its entry")
        kind = view[body]
        if not is_append(kind):  # another segment's creation between this one's appends, a padding
            at = frame_end
            continue
        frame_segment, offset = APPEND_V1_HEADER.unpack_from(view, body)[1:]
        if segment_id < 0:
            segment_id, expected = frame_segment, offset
        if frame_segment == segment_id:
            if _raw_crc32c(view[body:frame_end], _raw_crc32c(SEQ.pack(seq))) != crc:
                raise DataCorruptionError(f"journal frame at LSN {start_lsn + at} failed its CRC32C check")
            data = view[body + append_header_size(kind):frame_end]
            if offset > expected:
                raise DataCorruptionError(f"journal frames of segment {segment_id} skip bytes {expected}..{offset}")
            if offset + len(data) > expected:
                pieces.append(data[expected - offset:])
                expected = offset + len(data)
        at = frame_end
    result = b"".join(pieces)[entry.frame_skip:]
    if len(result) != entry.length:
        raise DataCorruptionError(f"journal frames at LSN {entry.frame_lsn} hold {len(result)} bytes, "
                                  f"not the {entry.length} recovery found")
    return result


def _file_index(files: list[tuple[int, Path]], lsn: int) -> int:
    return bisect.bisect_right(files, lsn, key=lambda f: f[0]) - 1


def read_range(files: list[tuple[int, Path]], written_lsn: int, lsn: int, length: int) -> bytes:
    """Blocking pread of written journal bytes; ``files`` as (start LSN, path)."""
    index = _file_index(files, lsn)
    if index < 0 or lsn + length > written_lsn:
        raise JournalCorruptionError(f"journal has no bytes at LSN {lsn}+{length}")
    start, path = files[index]
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), length, lsn - start)
    if len(data) != length:
        raise JournalCorruptionError(f"journal file {path.name} is short at LSN {lsn}")
    return data


def read_entries(
    files: list[tuple[int, Path]], written_lsn: int, entries: Sequence[TailEntryLike]
) -> list[bytes]:
    """Blocking: the data of tail entries, re-read from their frames, CRC-verified.

    Entries whose frames follow each other in one file are read with one pread, so a
    flush of a long evicted backlog costs one read per journal range, not per append."""
    results: list[bytes] = []
    index = 0
    while index < len(entries):
        start_lsn = entries[index].frame_lsn
        file_index = _file_index(files, start_lsn)
        file_end_lsn = files[file_index + 1][0] if 0 <= file_index < len(files) - 1 else written_lsn
        run_end = index + 1
        while (
            run_end < len(entries)
            and entries[run_end].frame_lsn == entries[run_end - 1].end_lsn
            and entries[run_end].end_lsn <= file_end_lsn  # a frame never spans two files
        ):
            run_end += 1
        raw = read_range(files, written_lsn, start_lsn, entries[run_end - 1].end_lsn - start_lsn)
        results += verified_payloads(raw, start_lsn, entries[index:run_end])
        index = run_end
    return results


IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def write_all(fd: int, pieces: list[bytes], total: int) -> None:
    """Write ``pieces`` (``total`` bytes) with writev(2), at most IOV_MAX at a time, so
    an append's data is never copied into a frame buffer (fresh 1 MiB copies cost more
    in page faults than the write itself)."""
    if len(pieces) <= IOV_MAX:  # the usual case: one call, which takes every byte
        written = os.writev(fd, pieces)
        if written < total:
            _write_after(fd, pieces, written)
        return
    for start in range(0, len(pieces), IOV_MAX):
        batch = pieces[start : start + IOV_MAX]
        written = os.writev(fd, batch)
        if written < sum(len(p) for p in batch):
            _write_after(fd, batch, written)


def _write_after(fd: int, pieces: list[bytes], written: int) -> None:
    """Rare (a signal, a device that takes less): write what follows the first
    ``written`` bytes of ``pieces``."""
    view = memoryview(b"".join(pieces))[written:]
    while view:
        view = view[os.write(fd, view) :]


def file_name(start_lsn: int) -> str:
    return f"{start_lsn:020d}{FILE_SUFFIX}"


def list_files(directory: Path) -> list[tuple[int, Path]]:
    """Journal files as (start LSN, path), oldest first."""
    files = []
    for entry in os.scandir(directory):
        if entry.name.endswith(FILE_SUFFIX) and entry.name[: -len(FILE_SUFFIX)].isdigit():
            files.append((int(entry.name[: -len(FILE_SUFFIX)]), Path(entry.path)))
    files.sort()
    return files


class TailEntryLike(Protocol):
    frame_lsn: int
    frame_skip: int
    end_lsn: int
    length: int
    frames: int  # > 1: this segment's frames in [frame_lsn, end_lsn) of one file (recovery merges)


@dataclasses.dataclass(frozen=True)
class ReplayedAppend:
    """One valid append frame found by recovery."""

    seq: int
    frame_lsn: int
    segment_id: int
    offset: int
    data: bytes
    end_lsn: int = 0  # LSN just past the frame
    wall_ns: int = 0  # the append's wall-clock time (0: a kind-1 frame, unknown)
    synced_lsn: int = 0  # the journal's durable LSN when it was queued (0: older kinds)
    writer: int = 0  # exactly-once identity (0: anonymous)
    writer_seq: int = 0


@dataclasses.dataclass(frozen=True)
class ReplayedCreate:
    """One valid create frame found by recovery."""

    seq: int
    frame_lsn: int
    segment_id: int
    name: str
    record: bytes  # the stored SegmentRecord
    end_lsn: int


@dataclasses.dataclass
class ScanResult:
    end_lsn: int  # LSN just past the last valid frame
    next_seq: int
    cut: tuple[Path, int] | None = None  # (file, byte offset) where a torn tail starts
    dropped_files: list[Path] = dataclasses.field(default_factory=list)
    # frames after the cut that were whole but never synced (a power loss wrote them
    # before what precedes them): dropped with the tail, never acknowledged as durable
    unsynced_frames_dropped: int = 0


@dataclasses.dataclass(frozen=True)
class DamagedStretch:
    """Bytes of a journal file that are not valid frames although a later frame proves
    they were synced (corruption, not a torn tail): ``[start, end)`` of ``path``, where
    the frames of sequence numbers ``first_seq`` to ``last_seq`` were."""

    path: Path
    start: int
    end: int
    start_lsn: int
    first_seq: int
    last_seq: int

    def describe(self) -> str:
        return (f"journal file {self.path} is damaged at byte offset {self.start} ({self.end - self.start} bytes, "
                f"frame seq {self.first_seq}" + (f"-{self.last_seq}" if self.last_seq != self.first_seq else "")
                + ") while frames after it are intact")
