"""Pure planning of offload and retention: which chunks a policy wants offloaded,
and how many head chunks it wants deleted, from chunk facts and a time.

Invariants:
- Pure: the planners look at chunk facts and a time, never at storage, so they are
  tested without a store; ``chunk_facts`` derives the facts from a segment's state.
- Only sealed chunks are ever picked; an offload threshold at or above the matching
  retention threshold was refused when the policy was set (``Policy.check``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tierfs.contracts.policy import Policy
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState


@dataclasses.dataclass(frozen=True)
class ChunkFacts:
    """What the planners need of one chunk, in segment order."""

    start: int
    length: int
    sealed_at_s: float | None  # None: the chunk can still grow
    offloaded: bool  # offload complete: the long-term copy is the one read


def chunks_to_offload(chunks: Sequence[ChunkFacts], policy: Policy, now_s: float, durable_length: int) -> list[int]:
    """Start offsets of the sealed, not yet offloaded chunks the policy says to offload."""
    chosen: set[int] = set()
    after_s = policy.offload_after_s
    if after_s is not None:
        chosen = {c.start for c in chunks if c.sealed_at_s is not None and not c.offloaded
                  and now_s - c.sealed_at_s >= after_s}
    hot_limit = policy.offload_hot_bytes
    if hot_limit is not None:
        start_offset = chunks[0].start if chunks else durable_length
        hot = durable_length - start_offset - sum(c.length for c in chunks if c.offloaded)
        hot -= sum(c.length for c in chunks if c.start in chosen)  # offloaded by time
        for c in chunks:
            if hot <= hot_limit:
                break
            if c.sealed_at_s is not None and not c.offloaded and c.start not in chosen:
                chosen.add(c.start)
                hot -= c.length
    return sorted(chosen)


def head_chunks_to_expire(chunks: Sequence[ChunkFacts], policy: Policy, now_s: float, durable_length: int) -> int:
    """How many chunks, from the head, retention deletes (only sealed ones, in order)."""
    if policy.retention_s is None and policy.retention_bytes is None:
        return 0
    retained = durable_length - (chunks[0].start if chunks else durable_length)
    count = 0
    for c in chunks:
        if c.sealed_at_s is None:
            break
        by_time = policy.retention_s is not None and now_s - c.sealed_at_s >= policy.retention_s
        by_size = policy.retention_bytes is not None and retained - c.length >= policy.retention_bytes
        if not (by_time or by_size):
            break
        count += 1
        retained -= c.length
    return count


def chunk_facts(seg: SegmentState, chunks: list[Chunk]) -> list[ChunkFacts]:
    """Chunk facts for the planners. A chunk is sealed once a later chunk exists
    (sealed when that one was created), or when its segment is sealed and every byte is
    flushed (sealed when the segment was)."""
    facts = []
    fully_flushed = seg.flushed_length == seg.durable_length == seg.appended_length
    for i, chunk in enumerate(chunks):
        sealed_at: float | None = None
        if i + 1 < len(chunks):
            sealed_at = chunks[i + 1].created_ns / 1e9
        elif seg.sealed and fully_flushed and not seg.sealing:
            sealed_at = (seg.record.sealed_ns or seg.record.modified_ns) / 1e9
        facts.append(ChunkFacts(chunk.start_offset, chunk.length, sealed_at, chunk.offload_complete))
    return facts
