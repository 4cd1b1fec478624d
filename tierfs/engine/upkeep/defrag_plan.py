"""Which chunks defrag merges: pure planning over a segment's chunk records.

A *run* is a sequence of adjacent chunks (each starts where the one before ends), each
below a size threshold, whose total fits in one chunk (``target_bytes``). Each run of
two or more chunks becomes one merged chunk.

Invariants:
- Only chunks that live in the chunk store and that no offload touched are planned
  (``location`` empty, no offload attempt): an offloaded chunk's bytes and keys belong
  to its attempt, so merging it would orphan or duplicate long-term objects.
- The segment's last chunk is planned only when asked (a sealed, fully flushed
  segment): the storage writer may still append to it.
- Runs never overlap and are returned in offset order; pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from tierfs.engine.record_types import Chunk


def mergeable(chunk: Chunk) -> bool:
    """In the chunk store and untouched by offload."""
    return chunk.location == "" and not chunk.offload_attempt_uuid and not chunk.offload_complete


def small_chunk_count(chunks: Sequence[Chunk], small_bytes: int) -> int:
    """Mergeable chunks below ``small_bytes`` (what the background pass's trigger counts)."""
    return sum(1 for c in chunks if mergeable(c) and c.length < small_bytes)


def merge_runs(
    chunks: Sequence[Chunk], small_bytes: int, target_bytes: int, *, include_last: bool
) -> list[tuple[int, int]]:
    """``[first, end)`` index ranges of ``chunks`` (in offset order) to merge: maximal
    runs of adjacent mergeable chunks below ``small_bytes``, cut so none exceeds
    ``target_bytes``, of at least two chunks."""
    candidates = len(chunks) if include_last else max(len(chunks) - 1, 0)
    runs: list[tuple[int, int]] = []
    first: int | None = None
    total_bytes = 0
    for index in range(candidates):
        chunk = chunks[index]
        fits = mergeable(chunk) and chunk.length < small_bytes
        if (
            fits
            and first is not None
            and chunks[index - 1].start_offset + chunks[index - 1].length == chunk.start_offset
            and total_bytes + chunk.length <= target_bytes
        ):
            total_bytes += chunk.length
            continue
        if first is not None and index - first >= 2:
            runs.append((first, index))
        first, total_bytes = (index, chunk.length) if fits else (None, 0)
    if first is not None and candidates - first >= 2:
        runs.append((first, candidates))
    return runs
