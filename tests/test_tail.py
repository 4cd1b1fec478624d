"""The in-memory tail of a segment: ``Tail.joined`` (the flush's one-pass read) gives
exactly the bytes ``Tail.pieces`` describes, and None once an overlapping entry was
evicted."""

from __future__ import annotations

import random

import pytest

from tierfs.engine.segments.tail import Tail, TailEntry


def _tail(lengths: list[int], evicted: set[int]) -> tuple[Tail, bytes]:
    tail = Tail()
    offset = 0
    payload = bytearray()
    for index, length in enumerate(lengths):
        data = bytes((offset + i) % 251 for i in range(length))
        payload += data
        tail.add(TailEntry(offset, length, 0, 0, 0, 0.0, None if index in evicted else data))
        offset += length
    return tail, bytes(payload)


@pytest.mark.parametrize("seed", range(4))
def test_joined_is_the_pieces_bytes_or_none_when_one_was_evicted(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 20))]
        evicted = {rng.randrange(20) for _ in range(rng.randint(0, 3))}
        tail, payload = _tail(lengths, evicted)
        start, end = sorted(rng.randint(0, len(payload)) for _ in range(2))
        pieces = tail.pieces(start, end)
        joined = tail.joined(start, end)
        if any(entry.data is None for entry, _, _ in pieces):
            assert joined is None
        else:
            assert joined == payload[start:end]
            assert joined == b"".join(entry.data[lo:hi] for entry, lo, hi in pieces if entry.data)
