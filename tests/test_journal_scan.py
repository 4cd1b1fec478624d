"""The recovery scan reads journal files in bounded pieces: whatever the piece size, it
finds the same frames, stops at the same torn frame and drops the same files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tierfs.engine.journal import scan as journal_scan
from tierfs.engine.journal.frames import ScanResult, encode_append, file_name
from tierfs.engine.journal.scan import scan


def write_journal(directory: Path, sizes: list[int], file_frames: int) -> list[tuple[int, Path]]:
    """Frames of the given payload sizes, ``file_frames`` per file; (start LSN, path)s."""
    rng = random.Random(5)
    files, lsn, seq = [], 0, 1
    for first in range(0, len(sizes), file_frames):
        path = directory / file_name(lsn)
        with open(path, "wb") as f:
            start = lsn
            for size in sizes[first : first + file_frames]:
                frame = encode_append(seq, 1 + seq % 3, seq * 10, rng.randbytes(size), wall_ns=seq)
                f.write(frame)
                lsn += len(frame)
                seq += 1
        files.append((start, path))
    return files


def scanned(files: list[tuple[int, Path]]) -> tuple[list[tuple[int, int, int, bytes]], ScanResult]:
    result = ScanResult(end_lsn=0, next_seq=1)
    frames = [(f.seq, f.frame_lsn, f.end_lsn, f.data) for f in scan(files, 1 << 20, result)]
    return frames, result


@pytest.mark.parametrize("piece_bytes", [1, 7, 64, 4096])
def test_every_piece_size_finds_the_same_frames_and_the_same_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece_bytes: int
) -> None:
    sizes = [random.Random(i).randrange(0, 3000) for i in range(60)]
    files = write_journal(tmp_path, sizes, file_frames=25)
    with open(files[1][1], "r+b") as f:  # tear the second file inside a frame
        f.truncate(f.seek(0, 2) - 11)
    expected_frames, expected = scanned(files)  # the default piece size: whole files
    monkeypatch.setattr(journal_scan, "READ_PIECE_BYTES", piece_bytes)
    frames, result = scanned(files)
    assert frames == expected_frames
    assert len(frames) == 49  # 25 in the first file, 24 whole ones in the torn second
    assert [f[0] for f in frames] == list(range(1, 50))
    assert result.cut == expected.cut and result.cut is not None and result.cut[0] == files[1][1]
    assert result.dropped_files == [files[2][1]] and result.end_lsn == frames[-1][2]


def test_a_bad_crc_stops_the_scan_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_journal(tmp_path, [100] * 10, file_frames=10)
    data = bytearray(files[0][1].read_bytes())
    frame_bytes = len(data) // 10
    data[6 * frame_bytes + 40] ^= 0xFF  # a payload byte of the 7th frame
    files[0][1].write_bytes(bytes(data))
    monkeypatch.setattr(journal_scan, "READ_PIECE_BYTES", 33)
    frames, result = scanned(files)
    assert [f[0] for f in frames] == [1, 2, 3, 4, 5, 6]
    assert result.cut == (files[0][1], 6 * frame_bytes) and result.next_seq == 7
