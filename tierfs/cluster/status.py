"""``tierfs cluster status``: who holds which container, from the lease table, with each
live daemon's flush backlog and lost+found, from its ``/metrics``.

Invariants:
- Read-only: it never registers, takes, renews or gives back a lease, needs no data dir
  and opens no store, so it can run on any machine that reaches the database.
- Every age is the database's clock, as the leases' own (hosts may disagree on the time).
- A daemon that does not answer is reported as unreachable, with why; it never hides
  the rest of the report.
- Metrics are read with a cluster daemon's own credentials (``host_credentials``: the
  registry holds no token), so only on a host with such a data dir; elsewhere the
  report says so and shows the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierfs.cluster.container_map import container_label
from tierfs.cluster.host_credentials import HostCredential
from tierfs.cluster.leases import LeaseTable
from tierfs.contracts.errors import InvalidArgumentError, TierFSError

METRICS_TIMEOUT_S = 5.0  # a daemon slower than this to answer is shown as unreachable


@dataclasses.dataclass(frozen=True)
class ContainerStatus:
    container: int
    owner: str | None
    epoch: int
    lease_left_s: float  # negative once expired

    @property
    def state(self) -> str:
        """``held`` (a lease not expired), ``expired`` (its owner is gone or cannot renew) or ``free``."""
        if self.owner is None:
            return "free"
        return "held" if self.lease_left_s > 0 else "expired"


@dataclasses.dataclass(frozen=True)
class DaemonStatus:
    daemon_id: str
    url: str
    heartbeat_age_s: float
    live: bool  # heartbeated within a lease
    containers: tuple[int, ...]  # held with a lease not expired
    reachable: bool | None = None  # None: not asked (not live)
    error: str = ""
    flush_backlog_bytes: int = 0
    flush_lag_s: float = 0.0
    lost_found_entries: int = 0
    lost_found_bytes: int = 0
    draining: bool = False  # ``tierfs cluster drain``: it gives its containers back, takes none


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    database: str  # the metadata URL without its password
    lease_s: float
    daemons: tuple[DaemonStatus, ...]
    containers: tuple[ContainerStatus, ...]

    @property
    def unserved(self) -> list[int]:
        """Containers no lease holds now: appends to them wait until a daemon takes them."""
        return [c.container for c in self.containers if c.state != "held"]

    def as_json(self) -> dict[str, Any]:
        return {
            "database": self.database, "lease_s": self.lease_s, "unserved": self.unserved,
            "daemons": [dataclasses.asdict(d) | {"containers": list(d.containers)} for d in self.daemons],
            "containers": [dataclasses.asdict(c) | {"name": container_label(c.container), "state": c.state}
                           for c in self.containers],
        }


NO_CREDENTIAL = ("metrics not read: no cluster daemon's data dir here (run this on a cluster host, "
                 "or name its --data-dir)")


def cluster_status(metadata_url: str, lease_s: float, *, read_metrics: bool = True,
                   credential: HostCredential | None = None, ca_path: str = "") -> ClusterStatus:
    """The cluster as the database sees it now, and (``read_metrics``, with
    ``credential``) as each live daemon does."""
    table = LeaseTable(metadata_url)
    try:
        if not table.has_cluster():
            raise InvalidArgumentError(f"{table.description} holds no cluster: no daemon with containers > 0 "
                                       "has run on it")
        registered = table.daemons()
        containers = tuple(ContainerStatus(*row) for row in table.leases())
    finally:
        table.close()
    daemons = []
    for daemon_id, url, age_s, draining in registered:
        held = tuple(c.container for c in containers if c.owner == daemon_id and c.state == "held")
        status = DaemonStatus(daemon_id, url, age_s, age_s < lease_s, held, draining=draining)
        if read_metrics and status.live:
            status = (_with_metrics(status, credential, ca_path) if credential is not None
                      else dataclasses.replace(status, error=NO_CREDENTIAL))
        daemons.append(status)
    return ClusterStatus(table.description, lease_s, tuple(daemons), containers)


def _with_metrics(status: DaemonStatus, credential: HostCredential, ca_path: str) -> DaemonStatus:
    from tierfs.remote.client import TierClient

    try:
        client = TierClient(status.url, credential.token, host_id=credential.daemon_id, ca_path=ca_path,
                            read_timeout_s=METRICS_TIMEOUT_S, overload_retry_s=1.0)
        try:
            metrics = client.metrics()
        finally:
            client.close()
    except TierFSError as e:
        return dataclasses.replace(status, reachable=False, error=str(e))
    return dataclasses.replace(
        status, reachable=True,
        flush_backlog_bytes=int(metrics.get("tierfs_flush_backlog_bytes", 0)),
        flush_lag_s=metrics.get("tierfs_flush_lag_seconds", 0.0),
        lost_found_entries=int(metrics.get("tierfs_lost_found_entries", 0)),
        lost_found_bytes=int(metrics.get("tierfs_lost_found_held_bytes", 0)))
