"""The Spark source's line splitter against a reference split, on random data cut into
random pieces: lines longer than a piece, lines split across pieces, range ends inside,
at and between records, and the skip of a record begun in an earlier range."""

from __future__ import annotations

import random

from tierfs.spark.read import split_lines


def reference(data: bytes, base: int, end: int, skip_first: bool) -> list[tuple[int, bytes]]:
    """Every record starting before ``end``, by slicing the whole buffer at once."""
    position = 0
    if skip_first:
        newline = data.find(b"\n")
        if newline < 0:
            return []
        position = newline + 1
    found = []
    while position < len(data) and base + position < end:
        newline = data.find(b"\n", position)
        stop = len(data) if newline < 0 else newline
        found.append((base + position, data[position:stop]))
        position = stop + 1
    return found


def cut(data: bytes, base: int, rng: random.Random, max_piece: int) -> list[tuple[int, bytes]]:
    pieces, position = [], 0
    while position < len(data):
        size = rng.randint(1, max_piece)
        pieces.append((base + position, data[position : position + size]))
        position += size
    return pieces


def random_lines(rng: random.Random) -> bytes:
    lines = []
    for _ in range(rng.randint(0, 30)):
        length = rng.choice([0, 1, 3, 10, 100, rng.randint(0, 2000)])
        lines.append(bytes(rng.choice(b"abc{}:,\"") for _ in range(length)))
    data = b"\n".join(lines)
    return data + b"\n" if rng.random() < 0.5 else data


def test_split_matches_reference_on_random_pieces() -> None:
    rng = random.Random(20261123)
    for _ in range(2000):
        data = random_lines(rng)
        base = rng.randint(0, 10**6)
        end = base + rng.randint(0, len(data) + 2)
        skip = rng.random() < 0.3
        pieces = cut(data, base, rng, rng.choice([1, 7, 64, 5000]))
        assert list(split_lines(iter(pieces), end, skip_first=skip)) == reference(data, base, end, skip)


def test_a_line_longer_than_many_pieces() -> None:
    long_line = b"x" * 1_000_000
    data = b"first\n" + long_line + b"\nlast"
    pieces = [(i, data[i : i + 4096]) for i in range(0, len(data), 4096)]
    assert list(split_lines(iter(pieces), len(data))) == [
        (0, b"first"), (6, long_line), (6 + len(long_line) + 1, b"last")
    ]


def test_records_split_between_two_ranges_are_read_once() -> None:
    data = b"".join(b'{"n": %d}\n' % n for n in range(5000))
    for boundary in (1, 9, 10, 11, len(data) // 2, len(data) - 1):
        first = list(split_lines(iter([(0, data)]), boundary))
        # the second range starts its stream one byte early, as iter_lines does
        rest = data[boundary - 1 :]
        pieces = [(boundary - 1 + i, rest[i : i + 333]) for i in range(0, len(rest), 333)]
        second = list(split_lines(iter(pieces), len(data), skip_first=True))
        assert first + second == reference(data, 0, len(data), False)
