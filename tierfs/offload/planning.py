"""Pure planning of offload and retention: which chunks a policy wants offloaded,
and how many head chunks it wants deleted, from chunk facts and a time.

Invariants:
- Pure: they look at chunk facts and a time, never at storage, so they are tested
  without a store.
- Only sealed chunks are ever picked; an offload threshold at or above the matching
  retention threshold was refused when the policy was set (``Policy.check``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tierfs.contracts.policy import Policy


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
