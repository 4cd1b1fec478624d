"""``SegmentHold``: what an open file on the mount holds, so that its descriptors read,
write and stat the file they opened, not whatever its name means later.

Invariants:
- A hold holds the segment's state, not its name: it follows renames through any front
  end (mount, CLI, API, fsspec), and the state stays in memory while it is held.
- A held segment that is deleted or replaced is detached, not deleted (``namespace``):
  it keeps serving its holds under a name no user can give; the last release deletes
  it. A detached segment left by a stop is deleted when the store opens: no hold
  outlives the process.
- Once the segment is gone (deleted while nothing held it: impossible while held; or
  its store closed: a cluster container whose lease moved) every call raises
  ``SegmentNotFoundError``/``StoreClosedError``; ``release`` then does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tierfs.contracts import names
from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.engine.read.readahead import SegmentReader
from tierfs.engine.read.reader import Reader
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.store.attributes import segment_info


class SyncingJournal(Protocol):
    async def sync(self) -> int: ...


class HoldingStore(Protocol):
    """What a hold uses of its store (``SegmentStore`` has it)."""

    @property
    def table(self) -> SegmentTable: ...

    @property
    def reader(self) -> Reader: ...

    @property
    def journal(self) -> SyncingJournal: ...

    def reader_of(self, name: str, lookup: Callable[[str], SegmentState] | None = None) -> SegmentReader: ...

    async def append_to(self, seg: SegmentState, data: bytes, expected_offset: int | None) -> int: ...

    async def delete_detached(self, seg: SegmentState) -> None: ...


class SegmentHold:
    def __init__(self, store: HoldingStore, seg: SegmentState) -> None:
        self._store = store
        self._seg = seg
        self._released = False
        seg.holds += 1

    @property
    def name(self) -> str:
        """The segment's name now (a detached name once its name was deleted or replaced)."""
        return self._seg.name

    @property
    def detached(self) -> bool:
        return names.is_detached(self._seg.name)

    def _live(self, _name: str = "") -> SegmentState:
        self._store.table.check_open()
        if self._seg.deleted:
            raise SegmentNotFoundError(self._seg.name)
        return self._seg

    async def info(self) -> SegmentInfo:
        return segment_info(self._live())

    def open_reader(self) -> SegmentReader:
        return self._store.reader_of(self._live().name, lookup=self._live)

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        return await self._store.reader.read_segment(self._live(), offset, length, unconfirmed=unconfirmed)

    async def append(self, data: bytes, *, expected_offset: int | None = None) -> int:
        return await self._store.append_to(self._live(), data, expected_offset)

    async def sync(self) -> int:
        seg = self._live()
        await self._store.journal.sync()
        return seg.durable_length

    async def release(self) -> None:
        """Once per hold; the last release of a detached segment deletes it."""
        if self._released:
            return
        self._released = True
        seg = self._seg
        seg.holds -= 1
        if seg.holds == 0 and names.is_detached(seg.name) and not seg.deleted and not self._store.table.closed:
            await self._store.delete_detached(seg)
