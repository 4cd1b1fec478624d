"""A store's metadata as a file (``tierfs metadata export|import``), by data dir: the
front ends' entry to ``engine.backup.transfer``, on SQLite (the data dir's file) or on
PostgreSQL (the store's database; a cluster's is ``cluster.metadata_transfer``).

Invariants: export reads one consistent state, even while a daemon serves the data
dir; import takes the data-dir lock, accepts only an empty store and changes nothing
on bad input (see ``engine.backup.transfer``).
"""

from __future__ import annotations

from typing import IO

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url
from tierfs.contracts.errors import MetadataFormatError
from tierfs.engine.backup.postgres_rows import PostgresRows
from tierfs.engine.backup.transfer import (
    export_metadata,
    import_metadata,
    lines_of,
    read_export,
    write_export,
)
from tierfs.engine.metadata.connection_pool import connect
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.dir_lock import DataDirLock


def export_store_metadata(config: StoreConfig, out: IO[bytes]) -> int:
    """Write the metadata of ``config.data_dir`` to ``out``; the number of rows."""
    if not is_postgresql_url(config.metadata_url):
        return export_metadata(config.data_dir / "metadata.sqlite", out)
    with connect(config.metadata_url, autocommit=False, application_name="tierfs-metadata", snapshot=True) as conn:
        with conn.transaction():
            return write_export(PostgresRows(conn), out)


def import_store_metadata(config: StoreConfig, source: IO[bytes]) -> int:
    """Load an export into the empty store of ``config.data_dir``; the number of rows."""
    if not is_postgresql_url(config.metadata_url):
        return import_metadata(config.data_dir, source)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = DataDirLock(config.data_dir)
    lock.acquire()
    try:
        MetadataStore.open(config.metadata_url, config.data_dir / "metadata.sqlite").close()  # the tables exist
        lines = lines_of(source)
        with connect(config.metadata_url, autocommit=False, application_name="tierfs-metadata") as conn, conn.transaction():
            rows = read_export(PostgresRows(conn), lines)
            if next(lines, None) is not None:
                raise MetadataFormatError("lines after the trailer")
        return rows
    finally:
        lock.release()
