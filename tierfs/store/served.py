"""``ServedStore``: what the daemon's HTTP API asks of the store it serves, beyond the
public API, and ``MountedStore``, what the FUSE mount asks: the single-host
``SegmentStore`` and a cluster daemon's router (``cluster.router.ClusterStore``) both
offer them, so the server and the mount are written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tierfs.contracts.api import SegmentReaderAPI, SegmentStoreAPI
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.contracts.reports.statistics import StoreStatistics


class StoreFence(Protocol):
    @property
    def fenced(self) -> bool: ...

    @property
    def lost_found_bytes(self) -> int: ...


class ServedStore(SegmentStoreAPI, Protocol):
    @property
    def config(self) -> StoreConfig: ...

    @property
    def epoch(self) -> int: ...

    @property
    def fence(self) -> StoreFence: ...

    def statistics(self) -> StoreStatistics: ...

    def container_statistics(self) -> dict[str, StoreStatistics]:
        """Cluster mode: each container held here (by its label, ``c003``), its own
        figures; one store: none."""
        ...


class HeldFile(Protocol):
    """An open descriptor's file (``store.holds.SegmentHold``): reads, writes and stats
    the segment it opened, whatever its name means later; ``name`` is its name now
    (a detached one, ``names.is_detached``, once its name was deleted or replaced)."""

    @property
    def name(self) -> str: ...

    @property
    def detached(self) -> bool: ...

    async def info(self) -> SegmentInfo: ...

    def open_reader(self) -> SegmentReaderAPI: ...

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes: ...

    async def append(self, data: bytes, *, expected_offset: int | None = None) -> int: ...

    async def sync(self) -> int: ...

    async def release(self) -> None: ...


class MountedStore(ServedStore, Protocol):
    """What the FUSE mount needs on top: growth listeners (called with a segment's or
    directory's name when its length or attributes change; they tell the kernel) and
    name listeners (called with every name created, removed or moved), or None where
    the store cannot tell of every name change (a cluster: other hosts change names
    too), so the mount keeps its entry cache short."""

    growth_listeners: list[Callable[[str], None]]
    name_listeners: list[Callable[[str], None]] | None

    def id_space(self, name: str) -> int:
        """The space ``name``'s segment id is unique in: 0 on one host (ids are never
        reused), the container in a cluster (each numbers its own); with the id it makes
        the file's inode number, the same for its whole life."""
        ...

    async def hold(self, name: str) -> HeldFile | None:
        """Hold the segment called ``name`` for an open descriptor; None where this
        process cannot (a cluster container another daemon owns): the descriptor then
        follows the name."""
        ...

    async def create_file(self, name: str) -> SegmentInfo:
        """Create an empty segment as a file system's create does (the parent must
        exist): answered once committed, durable like a VD append (with the journal's
        next sync: within ``vd_sync_interval_s``, and before any PD append to it, an
        ``fsync`` of it or a ``sync`` is acknowledged)."""
        ...
