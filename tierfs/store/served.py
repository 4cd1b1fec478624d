"""``ServedStore``: what the daemon's HTTP API asks of the store it serves, beyond the
public API: the single-host ``SegmentStore`` and a cluster daemon's router
(``cluster.router.ClusterStore``) both offer it, so the server is written once.
"""

from __future__ import annotations

import builtins
from typing import Any, Protocol

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.config import StoreConfig
from tierfs.store.statistics import StoreStatistics


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

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        """Chunks of a segment: name, URL, segment offset range, CRCs (direct reads)."""
        ...
