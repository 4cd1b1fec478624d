"""Which container a name lives in, and where a container's store keeps its parts.

A container is a complete single-owner store (journal, metadata, chunks) for a part of
the namespace: every top-level entry of the namespace, with everything below it, belongs
to one container, chosen by a stable hash of the entry's name. So a directory listing,
a rename inside one top-level entry and a concat of its segments stay inside one
container (one owner, one transaction); the root ``''`` is in every container.

Invariants:
- ``container_of`` is a pure function of the name and the container count, identical on
  every host and every version (CRC32 of the UTF-8 name); the count is fixed when the
  cluster's database is created.
- A container's store is isolated from every other one: its own data dir
  ``<data_dir>/containers/cNNN``, its own tier-2 prefix ``<tier2>/cNNN`` (so chunk
  names, owner claims and orphan sweeps never meet another container's), its own
  metadata schema ``cNNN`` in the shared database.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
import zlib
from pathlib import Path

from tierfs.contracts import names
from tierfs.contracts.config import StoreConfig


def container_label(container: int) -> str:
    return f"c{container:03d}"


def container_of(name: str, count: int) -> int:
    """The container of a canonical name ('' is the root: container 0 by convention)."""
    top = names.canonical(name, allow_root=True).split("/", 1)[0]
    return zlib.crc32(top.encode()) % count


def _join(url: str, label: str) -> str:
    return url.rstrip("/") + "/" + label


def with_schema(metadata_url: str, schema: str) -> str:
    """The PostgreSQL URL whose sessions use ``schema`` (libpq's ``options``)."""
    parts = urllib.parse.urlsplit(metadata_url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def container_data_dir(data_dir: Path, container: int) -> Path:
    return data_dir / "containers" / container_label(container)


def container_config(config: StoreConfig, container: int) -> StoreConfig:
    """The config of one container's store inside ``config``'s cluster daemon."""
    label = container_label(container)
    return dataclasses.replace(
        config,
        data_dir=container_data_dir(config.data_dir, container),
        tier2_url=_join(config.chunk_store_url, label),
        offload_url=_join(config.offload_url, label) if config.offload_url else "",
        metadata_url=with_schema(config.metadata_url, label),
        takeover=True,  # the lease, not tier-2's newest claim, says who owns the container
        containers=0,
    )
