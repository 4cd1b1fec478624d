"""tierfs: tiered storage for append-only segments.

Layering (imports flow one way; ``tests/test_layering.py`` enforces it):

    contracts          errors, names, config, value types, the API protocol, operations
      <- blocks        CRC32C, the verified-block check, opening fsspec filesystems
      <- engine        journal, tail, metadata, chunk storage, cache, reader, writer
      <- offload       long-term store, offload attempts, policy planning
      <- store         the façade: wiring, namespace, concat, retention, fsck
      <- cluster       containers, leases, the router (store + remote clients of the owners)
      <- server        HTTP API and daemon
    contracts, blocks <- remote <- spark, fsspec_impl     (clients: never the engine)
    store, server <- fuse;  everything <- cli, testing

Only the public API is re-exported here, and lazily: ``import tierfs`` (done by every
client, Spark executor and fsspec user) loads neither the journal, SQLite nor the
server until ``open_store``/``SegmentStore`` is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tierfs.contracts.config import StoreConfig as StoreConfig
from tierfs.contracts.config import load_config as load_config
from tierfs.contracts.errors import TierFSError as TierFSError
from tierfs.contracts.reports.info import DirectoryInfo as DirectoryInfo
from tierfs.contracts.reports.info import SegmentInfo as SegmentInfo
from tierfs.contracts.version import __version__ as __version__

if TYPE_CHECKING:
    from tierfs.store.facade import SegmentStore as SegmentStore
    from tierfs.store.facade import open_store as open_store

_LAZY = {"SegmentStore", "open_store"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from tierfs.store import facade

        return getattr(facade, name)
    raise AttributeError(f"module 'tierfs' has no attribute {name!r}")
