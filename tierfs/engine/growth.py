"""Growth notifications: who hears that a segment's durable length advanced.

Invariant: listeners run in the event loop, synchronously, and must not block (the
FUSE mount only queues an inode for invalidation); they receive the segment's name.
"""

from __future__ import annotations

from collections.abc import Callable

from tierfs.engine.segment_state import SegmentState


class GrowthNotifier:
    def __init__(self) -> None:
        self.listeners: list[Callable[[str], None]] = []

    def notify(self, seg: SegmentState) -> None:
        for listener in self.listeners:
            listener(seg.name)
