"""A store's metadata as a file (``tierfs metadata export|import``), by data dir: the
front ends' entry to ``engine.metadata_transfer``.

Invariants: export reads one consistent state, even while a daemon serves the data
dir; import takes the data-dir lock, accepts only an empty store and changes nothing
on bad input (see ``engine.metadata_transfer``).
"""

from __future__ import annotations

from typing import IO

from tierfs.contracts.config import StoreConfig
from tierfs.engine.backup.transfer import export_metadata, import_metadata


def export_store_metadata(config: StoreConfig, out: IO[bytes]) -> int:
    """Write the metadata of ``config.data_dir`` to ``out``; the number of rows."""
    return export_metadata(config.data_dir / "metadata.sqlite", out)


def import_store_metadata(config: StoreConfig, source: IO[bytes]) -> int:
    """Load an export into the empty store of ``config.data_dir``; the number of rows."""
    return import_metadata(config.data_dir, source)
