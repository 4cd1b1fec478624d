"""Change notifications: who hears that a segment grew or changed, and that a name
appeared or went away.

``listeners`` hear a name whose attributes changed: its durable length advanced (the
appender, a concat), or it was sealed, unsealed, chmod-ed, touched (the store). The
FUSE mount invalidates the kernel's cached attributes of that name.
``name_listeners`` hear every name a namespace change created, removed or moved (both
names of a rename): the mount invalidates the kernel's directory entry, so its entry
cache can be long however the change was made (mount, API, CLI).

Invariant: listeners run in the event loop, synchronously, after the change was
committed, and must not block (the mount only queues the work); they receive names.
"""

from __future__ import annotations

from collections.abc import Callable

from tierfs.engine.segments.state import SegmentState


class GrowthNotifier:
    def __init__(self) -> None:
        self.listeners: list[Callable[[str], None]] = []
        self.name_listeners: list[Callable[[str], None]] = []

    def notify(self, seg: SegmentState) -> None:
        self.changed(seg.name)

    def changed(self, name: str) -> None:
        """``name`` (a segment or a directory) has new attributes."""
        for listener in self.listeners:
            listener(name)

    def names_changed(self, *names: str) -> None:
        for name in names:
            for listener in self.name_listeners:
                listener(name)
