"""The Spark source's read-ahead (``read.SegmentBytes.pieces``): consecutive pieces
with several in flight, a short piece restarting the read-ahead after it, ``stop``
bounding what is read, and raw block pieces (``iter_block_pieces``) reading nothing
past the last block that starts in their range. In-process, the bytes served by a
stand-in for the daemon (a segment with no chunks is read entirely through it)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from tierfs.spark.read import READ_PIECE_BYTES, SegmentBytes, SegmentRange, iter_block_pieces

SEGMENT = "logs/readahead"


class Daemon:
    """Serves ``data``; ``short_at`` answers reads starting there with fewer bytes (as a
    daemon may); records the reads and the most that were in flight at once."""

    def __init__(self, data: bytes, short_at: frozenset[int] = frozenset()) -> None:
        self.data = data
        self.short_at = short_at
        self.reads: list[tuple[int, int]] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()

    def read(self, path: str, start: int, end: int) -> bytes:
        assert path == SEGMENT
        with self._lock:
            self.reads.append((start, end))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(0.002)  # long enough for the other read-ahead threads to start theirs
        with self._lock:
            self.in_flight -= 1
        if start in self.short_at:
            end = start + max(1, (end - start) // 3)
        return self.data[start:end]


def segment_bytes(daemon: Daemon, length: int) -> SegmentBytes:
    item = SegmentRange(SEGMENT, length, 0, length, [])
    direct: Any = None  # no chunks: never used
    client: Any = daemon
    return SegmentBytes(client, direct, item)


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_pieces_cover_the_segment_in_order_with_at_most_ahead_in_flight(ahead: int) -> None:
    data = random.Random(ahead).randbytes(1000)
    daemon = Daemon(data, short_at=frozenset({300, 733}))
    pieces = list(segment_bytes(daemon, len(data)).pieces(100, 100, ahead))
    assert b"".join(piece for _, piece in pieces) == data[100:]
    position = 100
    for start, piece in pieces:
        assert start == position
        position += len(piece)
    assert any(len(piece) < 100 and start + len(piece) < len(data) for start, piece in pieces)  # shorts were hit
    assert daemon.most_in_flight <= ahead
    if ahead > 1:
        assert daemon.most_in_flight > 1


def test_pieces_read_nothing_past_stop() -> None:
    data = bytes(range(256)) * 8
    daemon = Daemon(data)
    stream = segment_bytes(daemon, len(data)).pieces(0, 100, 3, stop=450)
    assert b"".join(piece for _, piece in stream) == data[:450]
    assert max(end for _, end in daemon.reads) == 450


def test_closing_early_cancels_reads_not_started() -> None:
    data = bytes(5000)
    daemon = Daemon(data)
    stream = segment_bytes(daemon, len(data)).pieces(0, 100, 2)
    next(stream)
    stream.close()
    assert len(daemon.reads) <= 3  # the first piece and at most two read ahead


def test_raw_block_pieces_stop_at_the_last_block_starting_in_the_range() -> None:
    block = 1000
    length = 3 * READ_PIECE_BYTES
    data = random.Random(7).randbytes(length)
    daemon = Daemon(data)
    item = SegmentRange(SEGMENT, length, 0, READ_PIECE_BYTES + 2500, [])
    pieces = list(iter_block_pieces(segment_bytes(daemon, length), item, block))
    got = b"".join(piece for _, piece in pieces)
    blocks_end = -(-item.end // block) * block
    assert got == data[:blocks_end]
    assert max(end for _, end in daemon.reads) == blocks_end
