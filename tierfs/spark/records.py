"""Newline-separated records of a segment range: the stream of read pieces cut into
blocks of whole records (``record_blocks``), one record at a time for the per-record
path (``split_lines``), and one block as Arrow arrays for the batch path
(``split_block``).

Invariants:
- A record belongs to the range its first byte is in: with ``skip_first`` the bytes up
  to and including the first newline belong to an earlier range and are skipped, and
  the record that crosses ``end`` is finished from the following pieces.
- A block holds consecutive whole records: each ends with its newline, except the last
  record of the stream (the end of a sealed segment) which may have none. A block is
  at most one piece plus the start of a record carried over from earlier pieces, so
  memory is bounded by the piece size and the longest record, never by the range.
- Linear in the bytes: each piece is searched from an index that moves forward, and
  only a record that continues into the next piece is copied (into ``pending``, which
  grows by appending), so no byte is copied more than twice whatever the line lengths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

MAX_BLOCK_BYTES = (1 << 31) - 1  # Arrow binary arrays have 32-bit offsets


def record_blocks(
    pieces: Iterable[tuple[int, bytes]], end: int, *, skip_first: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(offset, block) of the whole records that start before ``end`` in a stream of
    consecutive (offset, bytes) pieces, one block per piece that ends a record."""
    pending = bytearray()  # the start of a record that continues into the next piece
    pending_start = -1  # its offset; -1 while no record is pending
    for piece_start, piece in pieces:
        position = 0
        if skip_first:
            newline = piece.find(b"\n")
            if newline < 0:
                continue
            skip_first = False
            position = newline + 1
        block_start = pending_start if pending_start >= 0 else piece_start + position
        if block_start >= end:
            return
        if position >= len(piece):
            continue
        # The record holding byte ``end - 1`` is the range's last: it ends at the first
        # newline at or after that byte (or after the carried-over record's start).
        limit, last_piece = len(piece), False
        if end - 1 - piece_start < len(piece):
            cut = piece.find(b"\n", max(position, end - 1 - piece_start))
            if cut >= 0:
                limit, last_piece = cut + 1, True
        newline = piece.rfind(b"\n", position, limit)
        if newline < 0:  # no record ends in this piece
            pending += memoryview(piece)[position:]
            pending_start = block_start
            continue
        if pending_start >= 0:
            pending += memoryview(piece)[position : newline + 1]
            block = bytes(pending)
            pending.clear()
            pending_start = -1
        else:
            block = piece[position : newline + 1]
        yield block_start, block
        if last_piece:
            return
        position = newline + 1
        if position < len(piece):
            pending += memoryview(piece)[position:]
            pending_start = piece_start + position
    if pending_start >= 0:
        yield pending_start, bytes(pending)  # the last record, without a newline


def split_lines(
    pieces: Iterable[tuple[int, bytes]], end: int, *, skip_first: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of every line that starts before ``end`` in a
    stream of consecutive (offset, bytes) pieces; ``skip_first`` as in ``record_blocks``."""
    for block_start, block in record_blocks(pieces, end, skip_first=skip_first):
        position = 0
        while position < len(block):
            newline = block.find(b"\n", position)
            stop = len(block) if newline < 0 else newline
            yield block_start + position, block[position:stop]
            position = stop + 1


@dataclasses.dataclass(frozen=True)
class Lines:
    """The records of one block as Arrow arrays: ``values`` (binary, without newlines)
    and ``offsets`` (int64, each record's first byte in the segment); their bytes,
    newlines included, are ``block[low:high]``."""

    values: pa.Array
    offsets: pa.Array
    block: bytes
    low: int
    high: int

    def __len__(self) -> int:
        return len(self.values)

    @property
    def data(self) -> pa.Buffer:
        """``block[low:high]`` as an Arrow buffer, not copied."""
        return pa.py_buffer(self.block).slice(self.low, self.high - self.low)

    def slice(self, start: int, stop: int) -> Lines:
        """Records ``start`` to ``stop`` (indices), with their bytes."""
        if start == 0 and stop >= len(self):
            return self
        first = self.offsets[0].as_py() - self.low
        low = self.offsets[start].as_py() - first
        high = (self.offsets[stop].as_py() - first) if stop < len(self) else self.high
        return Lines(self.values.slice(start, stop - start), self.offsets.slice(start, stop - start),
                     self.block, low, high)

    def relative_starts(self) -> pa.Array:
        """Each record's first byte as an index into ``data`` (int64)."""
        return pc.subtract(self.offsets, self.offsets[0])


def split_block(block_start: int, block: bytes) -> Lines:
    """A block from ``record_blocks`` as Arrow arrays, split in C++ (one pass)."""
    if len(block) > MAX_BLOCK_BYTES:
        raise ValueError(f"a record of more than {MAX_BLOCK_BYTES} bytes at offset {block_start}")
    whole = pa.Array.from_buffers(pa.binary(), 1, [None, pa.array([0, len(block)], pa.int32()).buffers()[1],
                                                   pa.py_buffer(block)])
    values = pc.split_pattern(whole, "\n").flatten()
    if block.endswith(b"\n"):
        values = values.slice(0, len(values) - 1)  # what follows the last newline: nothing
    lengths = pc.add(pc.binary_length(values).cast(pa.int64()), 1)
    offsets = pc.add(pc.subtract(pc.cumulative_sum(lengths), lengths), block_start)
    return Lines(values, offsets, block, 0, len(block))
