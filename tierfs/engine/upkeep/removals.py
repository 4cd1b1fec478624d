"""Objects their owners are removing, so the orphan sweep does not take them for orphans.

The parts that delete objects the metadata references or queues (the garbage collector,
the offloader's hot copies and replaced attempts) delete first and commit the metadata
change after. Between the two the object is gone but still named; after the commit it
is named nowhere. A sweep that listed the object before its delete and read the
references after the commit sees an object nobody references: it deletes it again and
reports an orphan that never was one (nothing is lost, but the report and its warning
are false).

``RemovalLog`` closes that window. A removal is registered (``removing``) from before
its delete until after its commit; a sweep's ``watching`` set starts with every name
being removed at that moment and gains every name whose removal starts while it
watches. A removal that ended before the watch began deleted its object before the
sweep's listing started, so the listing cannot hold it.

Names are tier-2 object names and long-term keys in one namespace: their shapes never
coincide (a long-term key is a chunk or pack name plus an attempt UUID and a suffix).

Invariants: a name whose removal overlaps a watch is in that watch's set; a removal's
registration ends even when its delete or commit fails; concurrent removals of one name
are counted, not lost; no I/O and no awaiting (trio tasks share it without locks).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator, Set


class RemovalLog:
    def __init__(self) -> None:
        self._removing: Counter[str] = Counter()
        self._watches: list[set[str]] = []

    @contextlib.contextmanager
    def removing(self, names: Iterable[str]) -> Iterator[None]:
        """Around the delete of ``names`` and the metadata commit that follows it."""
        registered = list(names)
        self._removing.update(registered)
        for watch in self._watches:
            watch.update(registered)
        try:
            yield
        finally:
            self._removing.subtract(registered)
            self._removing += Counter()  # drops the names that reached zero

    @contextlib.contextmanager
    def watching(self) -> Iterator[Set[str]]:
        """Around a sweep's listing and reference read: the names removed meanwhile."""
        watch = set(self._removing)
        self._watches.append(watch)
        try:
            yield watch
        finally:
            self._watches.remove(watch)
