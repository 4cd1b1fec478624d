"""The policy scheduler: every ``policy_interval_s`` (or when woken), one pass over the
deletion lag, retention and offload policies.

Stages of a pass, in order: delete the chunk-store copies whose deletion lag has
passed; for each segment a policy applies to, delete the head chunks retention
expires (never while an offload job of that segment runs), then start an offload job
for the sealed chunks the policy wants offloaded.

Invariants:
- Decisions come from the pure planners (``planning``) and the injected wall clock, so
  tests move time without sleeping.
- A failed pass is logged and retried on the next tick; it never stops the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import trio

from tierfs.contracts.errors import TierFSError
from tierfs.contracts.policy import Policy
from tierfs.engine.ports import ChunkSource
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState
from tierfs.offload.offloader import Offloader
from tierfs.offload.planning import chunk_facts, chunks_to_offload, head_chunks_to_expire

log = logging.getLogger(__name__)


class PolicyScheduler:
    def __init__(
        self,
        offloader: Offloader,
        chunks: ChunkSource,
        segments_with_policy: Callable[[], Iterable[tuple[SegmentState, Policy]]],
        truncate_head: Callable[[SegmentState, list[Chunk]], Awaitable[None]],
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._offloader = offloader
        self._chunks = chunks
        self._segments_with_policy = segments_with_policy
        self._truncate_head = truncate_head
        self._clock = clock
        self._interval_s = interval_s
        self._wakeup = trio.Event()
        self.retention_deleted_chunks = 0
        self.retention_deleted_bytes = 0
        self.oldest_waiting_s = 0.0  # age of the oldest sealed chunk a policy wants offloaded

    def wake(self) -> None:
        """Evaluate policies and the deletion lag now (after a policy change, or in tests)."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.scan()
            except TierFSError as e:
                log.warning("offload/retention scan failed, will retry: %s", e)
            with trio.move_on_after(self._interval_s):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def scan(self) -> None:
        """One evaluation of the deletion lag, retention and offload policies."""
        offloader = self._offloader
        now_s = self._clock()
        await offloader.delete_due_hot_copies(now_s)
        oldest_waiting: float | None = None
        for seg, policy in self._segments_with_policy():
            chunks = await self._chunks.chunks_of(seg)
            facts = chunk_facts(seg, chunks)
            expire = head_chunks_to_expire(facts, policy, now_s, seg.durable_length)
            if expire and not offloader.is_running(seg):
                expired = chunks[:expire]
                await self._truncate_head(seg, expired)
                self.retention_deleted_chunks += len(expired)
                self.retention_deleted_bytes += sum(c.length for c in expired)
                facts = facts[expire:]
            if offloader.long_term is None:
                continue
            starts = chunks_to_offload(facts, policy, now_s, seg.durable_length)
            for fact in facts:
                if fact.start in starts and fact.sealed_at_s is not None:
                    oldest_waiting = min(oldest_waiting or fact.sealed_at_s, fact.sealed_at_s)
            if starts and not offloader.is_running(seg):
                offloader.start_job(seg, starts, "policy")
        self.oldest_waiting_s = 0.0 if oldest_waiting is None else max(0.0, now_s - oldest_waiting)
