"""``tierfs metadata export|import`` of a cluster: every container's metadata in one
stream, format ``tierfs-cluster-metadata`` version 1 (docs/METADATA_FORMAT.md): a
header naming the container count, then each container's store export (a line
``{"container": N}`` before it), then a trailer.

Invariants:
- An export reads every container inside one REPEATABLE READ, read-only transaction:
  one consistent state of the whole namespace, even while the daemons serve it.
- An import goes into a database with no cluster yet (it is created with the export's
  container count: a name's container follows from that count) or a cluster with that
  count whose containers are all empty, and no live daemon serves it. All containers
  are loaded in one transaction, every line checked as a store import checks it: on any
  problem nothing changed.
- Each container's store record keeps the higher epoch (``backup.transfer``), so the
  new owners name every object above what the exported cluster's owners wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from tierfs.cluster.container_map import container_label, with_schema
from tierfs.cluster.leases import LeaseTable
from tierfs.contracts.errors import InvalidArgumentError, MetadataFormatError
from tierfs.engine.backup.postgres_rows import PostgresRows
from tierfs.engine.backup.transfer import lines_of, read_export, write_export, write_line
from tierfs.engine.metadata.connection_pool import connect
from tierfs.engine.metadata.store import MetadataStore

CLUSTER_FORMAT = "tierfs-cluster-metadata"
CLUSTER_VERSION = 1


def export_cluster_metadata(metadata_url: str, out: IO[bytes]) -> int:
    """Write every container's metadata to ``out``; the number of rows."""
    table = LeaseTable(metadata_url)
    try:
        if not table.has_cluster():
            raise InvalidArgumentError(f"{table.description} holds no cluster to export")
        count = len(table.epochs())
    finally:
        table.close()
    rows = 0
    with connect(metadata_url, autocommit=False, application_name="tierfs-metadata", snapshot=True) as conn:
        with conn.transaction():
            write_line(out, {"format": CLUSTER_FORMAT, "version": CLUSTER_VERSION, "containers": count})
            for container in range(count):
                conn.execute("SELECT set_config('search_path', %s, true)", (container_label(container),))
                write_line(out, {"container": container})
                rows += write_export(PostgresRows(conn), out)
            write_line(out, {"end": True, "containers": count})
    return rows


def import_cluster_metadata(metadata_url: str, source: IO[bytes], containers: int, lease_s: float) -> int:
    """Load a cluster export of ``containers`` containers (the importing config's count,
    which must be the export's) into ``metadata_url`` (see the module docstring); the
    number of rows."""
    lines = lines_of(source)
    header = next(lines, None)
    if header is None or header[1].get("format") != CLUSTER_FORMAT:
        raise MetadataFormatError(f"not a {CLUSTER_FORMAT} export (the first line is its header; a single "
                                  "store's export goes into a store with containers = 0)")
    if header[1].get("version") != CLUSTER_VERSION:
        raise MetadataFormatError(f"{CLUSTER_FORMAT} version {header[1].get('version')!r} is not one this "
                                  f"tierfs reads ({CLUSTER_VERSION})")
    count = header[1].get("containers")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise MetadataFormatError(f"line 1: 'containers' must be a positive integer, not {count!r}")
    if count != containers:
        raise InvalidArgumentError(f"the export holds {count} containers and this config has {containers}: a "
                                   "name's container follows from the count, so import with containers = "
                                   f"{count}")
    table = LeaseTable(metadata_url)
    try:
        serving = table.live_daemons(lease_s) if table.has_cluster() else {}
        if serving:
            raise InvalidArgumentError(f"{len(serving)} daemon(s) serve the cluster in {table.description} "
                                       f"({', '.join(sorted(serving))}): stop them before an import")
        table.set_up(count)  # a different count is refused here
    finally:
        table.close()
    for container in range(count):  # each container's tables exist, at the current version
        MetadataStore.open(with_schema(metadata_url, container_label(container)), Path("/nonexistent")).close()
    rows = 0
    with connect(metadata_url, autocommit=False, application_name="tierfs-metadata") as conn, conn.transaction():
        for container in range(count):
            number, marker = next(lines, (0, {}))
            if marker.get("container") != container:
                raise MetadataFormatError(f"line {number or 'end'}: expected container {container}'s export")
            conn.execute("SELECT set_config('search_path', %s, true)", (container_label(container),))
            rows += read_export(PostgresRows(conn), lines)
        number, trailer = next(lines, (0, {}))
        if trailer.get("end") is not True or trailer.get("containers") != count:
            raise MetadataFormatError(f"line {number or 'end'}: expected the trailer of {count} containers "
                                      "(truncated?)")
        if next(lines, None) is not None:
            raise MetadataFormatError("lines after the trailer")
    return rows
