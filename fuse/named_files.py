"""``NamedFile``: an open descriptor's file where the store cannot hold it (a cluster
container another daemon owns, ``MountedStore.hold`` None): every call goes by the
name the mount knows for the descriptor's inode.

Invariant: it offers what ``HeldFile`` does, so the handlers are written once; unlike a
hold it follows the name, not the file (a replaced name reaches the new file, a deleted
one answers ENOENT).
"""

from __future__ import annotations

from collections.abc import Callable

from tierfs.contracts.api import SegmentReaderAPI
from tierfs.contracts.errors import IsADirectoryError_
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.store.served import MountedStore


class NamedFile:
    detached = False

    def __init__(self, store: MountedStore, name_of: Callable[[], str]) -> None:
        self._store = store
        self._name_of = name_of

    @property
    def name(self) -> str:
        return self._name_of()

    async def info(self) -> SegmentInfo:
        info = await self._store.stat(self.name)
        if not isinstance(info, SegmentInfo):
            raise IsADirectoryError_(info.name)
        return info

    def open_reader(self) -> SegmentReaderAPI:
        return self._store.open_reader(self.name)

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        return await self._store.read(self.name, offset, length, unconfirmed=unconfirmed)

    async def append(self, data: bytes, *, expected_offset: int | None = None) -> int:
        return await self._store.append(self.name, data, expected_offset=expected_offset)

    async def sync(self) -> int:
        return await self._store.sync(self.name)

    async def release(self) -> None:
        return None
