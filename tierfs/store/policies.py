"""Offload and retention policies on directories, and retention's head truncation.

A policy key set on a directory applies to everything below it; each key is inherited
on its own from the nearest directory (or the root) that sets it.

Invariants:
- ``set_policy`` validates the change against every directory at and below the one it
  changes before committing, and restores the old record on any failure.
- ``truncate_head`` deletes whole head chunks only, in one conditional transaction under
  the segment's metadata lock; it does nothing if the head changed meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from tierfs.contracts import names
from tierfs.contracts.policy import Policy
from tierfs.engine.clock import now_ns
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.upkeep.garbage import GarbageCollector

log = logging.getLogger(__name__)


class PolicyBook:
    def __init__(
        self,
        table: SegmentTable,
        catalogue: ChunkCatalogue,
        garbage: GarbageCollector,
    ) -> None:
        self._table = table
        self._catalogue = catalogue
        self._garbage = garbage
        # called after a policy changed (the store points it at the policy scheduler)
        self.on_change: Callable[[], None] = lambda: None

    def _ancestors(self, name: str) -> list[str]:
        """'' (the root) and every directory above ``name``, outermost first."""
        parts = name.split("/") if name else []
        return [""] + ["/".join(parts[:depth]) for depth in range(1, len(parts))]

    def _policy_chain(self, name: str) -> list[str]:
        """The directories whose policies apply to ``name``, outermost first (itself
        included if it is a directory)."""
        return self._ancestors(name) + ([name] if name in self._table.directories else [])

    def effective_policy(self, name: str) -> Policy:
        """The policy that applies to ``name``: each key from the nearest directory
        (itself included if it is one) that sets it."""
        policy = Policy()
        for directory in self._policy_chain(name):
            record = self._table.directory_record(directory)
            if record.policy_set:
                policy = Policy.from_record(record).over(policy)
        return policy

    def segments_with_policy(self) -> Iterator[tuple[SegmentState, Policy]]:
        """Every segment a policy applies to, with that policy: a walk of the subtrees
        of the directories that set one, so segments no policy covers are never read."""
        table = self._table
        if table.root_directory.policy_set:
            tops = [""]
        else:
            with_policy = sorted(d for d, record in table.directories.items() if record.policy_set)
            tops = [d for d in with_policy if not any(names.is_within(d, outer) for outer in with_policy if outer != d)]
        for top in tops:
            for found in table.walk(top):
                policy = self.effective_policy(found.name)
                if policy.is_empty:
                    continue
                seg = found if isinstance(found, SegmentState) else table.segment_by_id(found.segment_id)
                if seg is not None and not seg.deleted:
                    yield seg, policy

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        """Set (or, with None, unset) policy keys on a directory ('' is the root)."""
        table = self._table
        table.check_open()
        directory = names.canonical(name, allow_root=True)
        async with table.lock:
            table.require_directory(directory)
            old = table.directory_record(directory)
            updated = Policy.from_record(old).changed(assignments).stored_in(old)
            table.set_directory_record(directory, updated)
            try:
                # the change must leave every directory at and below this one consistent
                for inner in [directory, *table.directories]:
                    if inner == directory or names.is_within(inner, directory):
                        self.effective_policy(inner).check(inner)
                metadata = self._catalogue.metadata
                await self._catalogue.call(metadata.update_directory, directory, updated)
            except BaseException:
                table.set_directory_record(directory, old)
                raise
        self.on_change()
        return self.get_policy(directory)

    def get_policy(self, name: str) -> dict[str, Any]:
        """The keys set on ``name`` itself, and the effective value of each key with the
        directory it comes from."""
        table = self._table
        table.check_open()
        canonical = names.canonical(name, allow_root=True)
        if canonical and canonical not in table.directories:
            table.segment(canonical)  # not found / is a segment: still report effective
        own = Policy.from_record(table.directory_record(canonical)).items() if (
            table.is_directory(canonical)) else {}
        effective: dict[str, dict[str, Any]] = {}
        for directory in self._policy_chain(canonical):
            for key, value in Policy.from_record(table.directory_record(directory)).items().items():
                effective[key] = {"value": value, "from": directory}
        return {"path": canonical, "set": own, "effective": effective}

    async def truncate_head(self, seg: SegmentState, chunks: list[Chunk]) -> None:
        """Retention: delete whole head ``chunks`` (which must be the first ones, sealed
        and flushed); bytes below the next chunk can no longer be read."""
        async with seg.meta_lock:
            current = await self._catalogue.chunks_of(seg)
            if seg.deleted or current[: len(chunks)] != chunks:
                return
            last = chunks[-1]
            record = dataclasses.replace(
                seg.record,
                start_offset=last.start_offset + last.length,
                chunk_count=max(0, seg.record.chunk_count - len(chunks)),
                changed_ns=now_ns(),
            )
            await self._catalogue.truncate_head(seg, record, chunks)
        log.info("retention: deleted %d chunks of %r, it now starts at %d",
                 len(chunks), seg.name, record.start_offset)
        self._garbage.collect_soon()
