"""Store configuration: defaults, TOML file, ``TIERFS_*`` environment, flags.

Invariants:
- Precedence is flags > environment > TOML file > defaults; embedded defaults need no
  configuration at all.
- Every value is validated once, here, with an error naming the setting; the rest of
  the code trusts a ``StoreConfig``.
- Values are taken as people write them, wherever they come from (``StoreConfig(...)``,
  flags, environment, TOML): ``data_dir`` as a ``str`` or ``Path`` (``~`` expanded),
  ``*_bytes`` settings with units (``64MiB``), ``*_s`` settings with units (``4h``);
  see ``units``. Inside, sizes are ints of bytes and times floats of seconds.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierfs.contracts.database_urls import (
    SQLITE_URL,
    is_postgresql_url,
    is_sqlite_url,
    redacted_url,
)
from tierfs.contracts.datadir import default_data_dir
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.units import parse_duration, parse_size

KiB = 1 << 10
MiB = 1 << 20
# vd: acknowledged after write(2) (fsync within vd_sync_interval_s); pd: after fdatasync;
# tier2: after the bytes are in tier-2 and committed to the metadata (survives the host)
DURABILITY_LEVELS = ("pd", "vd", "tier2")



@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """Everything a store needs; sizes in bytes, times in seconds."""

    data_dir: Path = dataclasses.field(default_factory=default_data_dir)
    # tier-2 chunk store URL; empty means "<data_dir>/chunks" on the local disk.
    tier2_url: str = ""
    # Storage options passed to fsspec for tier-2 (endpoint_url, key, ...).
    tier2_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # S3-compatible endpoint for an s3:// tier-2 (else AWS_ENDPOINT_URL / AWS config).
    tier2_endpoint_url: str = ""
    durability: str = "pd"
    # Where the metadata lives: "sqlite:" (the data dir's metadata.sqlite) or a
    # postgresql:// URL (psycopg 3 / libpq form). Printed only through
    # ``metadata_description`` (no password).
    metadata_url: str = dataclasses.field(default=SQLITE_URL, repr=False)
    # VD segments are fsynced at least this often (BP-14 bounded interval).
    vd_sync_interval_s: float = 1.0
    # Storage writer triggers (Pravega's aggregation thresholds).
    flush_bytes: int = 4 * MiB
    flush_interval_s: float = 1.0
    max_chunk_bytes: int = 64 * MiB
    # One flush writes at most this much, so a huge backlog is flushed in bounded steps.
    max_flush_bytes: int = 16 * MiB
    # Appends are refused once this many bytes wait to be flushed to tier-2.
    max_backlog_bytes: int = 1024 * MiB
    # Unflushed bytes kept in RAM; older unflushed bytes are re-read from the journal.
    tail_memory_bytes: int = 64 * MiB
    # Larger appends leave memory once written to the journal and are read back from
    # it (the page cache) when flushed or read: their buffers are reused, not held.
    tail_keep_max_bytes: int = 64 * KiB
    max_append_bytes: int = 64 * MiB
    journal_file_bytes: int = 64 * MiB
    # Concurrent blocking tier-2 calls (worker threads).
    tier2_concurrency: int = 16
    tier2_retry_initial_s: float = 0.2
    tier2_retry_max_s: float = 30.0
    # A GET of tier-2 or of the long-term store is abandoned and asked again when it has
    # not completed after this long per MiB asked: ~1 s for a 1 MiB block, fifty times a
    # healthy S3 GET, so a stalled request costs a reader about a second.
    tier2_read_timeout_s: float = 1.0
    block_cache_bytes: int = 256 * MiB
    # Sequential readers prefetch up to this far ahead (see readahead.py).
    readahead_max_bytes: int = 32 * MiB
    # Long-term store for offloaded chunks (any fsspec URL, typically s3://bucket/prefix);
    # empty: offload is off.
    offload_url: str = ""
    offload_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    offload_endpoint_url: str = ""
    # The chunk-store copy of an offloaded chunk is deleted this long after the offload
    # completed (Pulsar's deletion lag; 0 deletes it at once).
    offload_deletion_lag_s: float = 4 * 3600.0
    # Chunks offloaded at once, and parallel multipart parts per chunk.
    offload_concurrency: int = 2
    offload_upload_concurrency: int = 8
    offload_part_bytes: int = 8 * MiB
    # How often policies (offload_after_s, offload_hot_bytes, retention) and the
    # deletion lag are evaluated.
    policy_interval_s: float = 10.0
    # Orphan GC (engine/upkeep/orphans.py): unreferenced chunk and offload objects older than
    # the grace period are deleted every orphan_gc_interval_s (0: only by `tierfs gc`).
    # The grace keeps objects a flush or an offload (here or a restarted owner) may
    # still be writing; an hour is far beyond any single write.
    orphan_gc_interval_s: float = 3600.0
    orphan_grace_s: float = 3600.0
    # Defrag (docs/ARCHITECTURE.md): every defrag_interval_s (0: never in the
    # background) a segment holding more than defrag_min_small_chunks chunks below
    # defrag_small_chunk_bytes gets its runs of adjacent small chunks merged into chunks
    # of up to max_chunk_bytes. Merged-away objects are deleted offload_deletion_lag_s
    # later (readers may still hold the old chunk list).
    defrag_interval_s: float = 300.0
    defrag_small_chunk_bytes: int = 1 * MiB
    defrag_min_small_chunks: int = 16
    # Tier-2's owner claims are checked at least this often (and at least once per
    # flush_interval_s): a fenced store stops acknowledging appends within it.
    owner_check_interval_s: float = 1.0
    # Claim tier-2 even if another owner holds it (``tierfs takeover``, ``--takeover``):
    # that owner is fenced (engine/ownership/fencing.py).
    takeover: bool = False
    # Repair a damaged journal while opening (``tierfs fsck --repair``): damaged bytes
    # and the intact frames that cannot follow them go to lost+found (engine/recovery/journal_repair.py).
    repair_journal: bool = False
    # Cluster mode (docs/ARCHITECTURE.md, "Many hosts"): with a postgresql:// metadata
    # URL, the namespace is split into this many segment containers (fixed when the
    # database is first used), each owned by one daemon through a lease; 0 is one store.
    containers: int = 0
    # A container's owner renews its lease this often divided by three (at least every
    # second); a daemon that stops renewing loses its containers to the others this long
    # after its last renewal: a kill -9 is a failover of ~4-5 s. Longer rides out longer
    # stalls of an owner (a paused VM, a slow database) without a failover.
    lease_s: float = 4.0
    # The URL other daemons reach this one at (forwarded writes and tails), e.g.
    # http://10.0.0.5:7070; default: http:// + the --listen address.
    cluster_url: str = ""
    # The TCP port this daemon takes the appends other daemons forward on (on the
    # --listen host; others reach it at cluster_url's host), registered with it in the
    # database; 0: a free port the system picks. Set it where a firewall must know it.
    cluster_append_port: int = 0
    # TLS on the daemon's TCP listeners (--listen's API and a cluster daemon's append
    # listener): its certificate chain and private key (PEM), both or neither. The CA
    # file is what this process trusts when it connects to a daemon over TLS (other
    # hosts, or a client); empty: the system's CAs.
    tls_cert_path: str = ""
    tls_key_path: str = ""
    tls_ca_path: str = ""

    def __post_init__(self) -> None:
        for name, value in _normalized(self).items():
            object.__setattr__(self, name, value)  # frozen: normalized once, here
        if not (is_sqlite_url(self.metadata_url) or is_postgresql_url(self.metadata_url)):
            raise InvalidArgumentError(
                f"metadata must be 'sqlite:' (the default) or a postgresql:// URL, not "
                f"{redacted_url(self.metadata_url)!r}"
            )
        if self.containers < 0 or (self.containers and not is_postgresql_url(self.metadata_url)):
            raise InvalidArgumentError(
                f"containers must be 0, or > 0 with a postgresql:// metadata URL, not {self.containers!r}"
            )
        if self.durability not in DURABILITY_LEVELS:
            raise InvalidArgumentError(
                f"durability must be one of {DURABILITY_LEVELS}, not {self.durability!r}"
            )
        positive = (
            "vd_sync_interval_s flush_bytes flush_interval_s max_chunk_bytes "
            "max_flush_bytes max_backlog_bytes max_append_bytes journal_file_bytes "
            "tier2_concurrency tier2_retry_initial_s tier2_retry_max_s tier2_read_timeout_s "
            "block_cache_bytes offload_concurrency offload_upload_concurrency "
            "policy_interval_s defrag_small_chunk_bytes defrag_min_small_chunks owner_check_interval_s "
            "lease_s"
        ).split()
        for name in positive:
            if not getattr(self, name) > 0:
                raise InvalidArgumentError(f"{name} must be > 0, not {getattr(self, name)!r}")
        if min(self.tail_memory_bytes, self.tail_keep_max_bytes, self.readahead_max_bytes) < 0:
            raise InvalidArgumentError(
                "tail_memory_bytes, tail_keep_max_bytes and readahead_max_bytes must be >= 0"
            )
        if not 5 * MiB <= self.offload_part_bytes <= 64 * MiB:
            raise InvalidArgumentError(
                "offload_part_bytes must be within 5 MiB..64 MiB (S3 multipart limits)"
            )
        if not 0 <= self.cluster_append_port <= 65535:
            raise InvalidArgumentError(f"cluster_append_port must be 0..65535, not {self.cluster_append_port!r}")
        if bool(self.tls_cert_path) != bool(self.tls_key_path):
            raise InvalidArgumentError("TLS needs both a certificate and its key (tls_cert_path and tls_key_path, "
                                       "--tls-cert and --tls-key), or neither")
        for name in ("tls_cert_path", "tls_key_path", "tls_ca_path"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise InvalidArgumentError(f"{name}: no such file: {path!r}")
        if self.defrag_interval_s < 0:
            raise InvalidArgumentError("defrag_interval_s must be >= 0 (0: no background defrag)")
        if self.offload_deletion_lag_s < 0:
            raise InvalidArgumentError("offload_deletion_lag_s must be >= 0")
        if min(self.orphan_gc_interval_s, self.orphan_grace_s) < 0:
            raise InvalidArgumentError("orphan_gc_interval_s and orphan_grace_s must be >= 0")
        if self.max_append_bytes > self.max_backlog_bytes:
            raise InvalidArgumentError("max_append_bytes must not exceed max_backlog_bytes")

    @property
    def metadata_description(self) -> str:
        """Where the metadata lives, printable (no password)."""
        if is_postgresql_url(self.metadata_url):
            return redacted_url(self.metadata_url)
        return str(self.data_dir / "metadata.sqlite")

    @property
    def chunk_store_url(self) -> str:
        return self.tier2_url or str(self.data_dir / "chunks")

    @property
    def tier2_identity(self) -> str:
        """The tier-2 a data dir's metadata is bound to: "" for its own ``chunks/`` (it
        moves with the data dir), an absolute path for a local one, else the URL
        without secrets."""
        if not self.tier2_url:
            return ""
        if "://" not in self.tier2_url or self.tier2_url.startswith("file://"):
            return os.path.abspath(os.path.expanduser(self.tier2_url.removeprefix("file://")))
        return redacted_url(self.tier2_url)

    @property
    def chunk_store_options(self) -> dict[str, Any]:
        """fsspec storage options for tier-2: ``tier2_options`` plus the endpoint."""
        options = dict(self.tier2_options)
        if self.tier2_endpoint_url:
            options.setdefault("endpoint_url", self.tier2_endpoint_url)
        return options

    @property
    def long_term_options(self) -> dict[str, Any]:
        """fsspec storage options for the long-term store: ``offload_options`` plus
        the endpoint."""
        options = dict(self.offload_options)
        if self.offload_endpoint_url:
            options.setdefault("endpoint_url", self.offload_endpoint_url)
        return options

    def replace(self, **changes: Any) -> StoreConfig:
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(StoreConfig)}


def _is_size(name: str) -> bool:
    return name.endswith("_bytes")


def _is_duration(name: str) -> bool:
    return name.endswith("_s")


def _normalized(config: StoreConfig) -> dict[str, Any]:
    """The fields given as people write them (a str path, ``"64MiB"``, ``"4h"``), as
    the types the code uses."""
    changes: dict[str, Any] = {}
    for name in StoreConfig.__dataclass_fields__:
        value = getattr(config, name)
        if name == "data_dir" and not isinstance(value, Path):
            if not isinstance(value, (str, os.PathLike)):
                raise InvalidArgumentError(f"data_dir must be a path, not {value!r}")
            changes[name] = Path(os.path.expanduser(os.fspath(value)))
        elif _is_size(name) and type(value) is not int:
            changes[name] = parse_size(value, name)
        elif _is_duration(name) and type(value) is not float:
            changes[name] = parse_duration(value, name)
    return changes
_OPTION_TABLES = ("tier2_options", "offload_options")
# environment names that differ from TIERFS_<FIELD>
_ENV_NAMES = {"tier2_url": "TIERFS_TIER2", "offload_url": "TIERFS_OFFLOAD_TO",
              "metadata_url": "TIERFS_METADATA"}


def _coerce(name: str, raw: Any) -> Any:
    default = StoreConfig.__dataclass_fields__[name].default
    if name == "data_dir":
        return Path(os.path.expanduser(str(raw)))
    if _is_size(name):
        return parse_size(raw, name)
    if _is_duration(name):
        return parse_duration(raw, name)
    if name in _OPTION_TABLES:
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError(f"{name} must be a table of options")
        return dict(raw)
    try:
        if isinstance(default, bool):
            return str(raw).lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"setting {name}: cannot use {raw!r}") from None
    return str(raw)


def load_config(
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> StoreConfig:
    """Build a config from defaults < TOML file < ``TIERFS_*`` environment < overrides.

    The TOML file is ``config_file``, else ``$TIERFS_CONFIG``; it is optional. Keys are
    the ``StoreConfig`` field names; unknown keys are an error so typos do not pass.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = config_file or env.get("TIERFS_CONFIG")
    if path:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except FileNotFoundError:
            raise InvalidArgumentError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise InvalidArgumentError(f"config file {path}: {e}") from None
        section = table.get("tierfs", table)
        for key, raw in section.items():
            if key not in _FIELDS:
                raise InvalidArgumentError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(key, raw)
    for key in _FIELDS:
        env_name = _ENV_NAMES.get(key, "TIERFS_" + key.upper())
        if env_name in env and key not in _OPTION_TABLES:
            values[key] = _coerce(key, env[env_name])
    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        if key not in _FIELDS:
            raise InvalidArgumentError(f"unknown setting {key!r}")
        values[key] = _coerce(key, raw)
    return StoreConfig(**values)
