"""``tierfs cluster status``: the hosts and containers of a cluster (cluster/status.py),
as two tables or, with ``--json``, one JSON document; ``drain`` and ``undrain`` (cluster/drain.py).

Invariant: it gets the config, not a store: it works on the cluster's PostgreSQL
database (and reads the daemons' metrics), never on a store opened here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tierfs.cluster.container_map import container_label
from tierfs.cluster.drain import drain, undrain
from tierfs.cluster.host_credentials import HostCredential
from tierfs.cluster.status import NO_CREDENTIAL, ClusterStatus, DaemonStatus, cluster_status
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.database_urls import is_postgresql_url
from tierfs.contracts.datadir import DAEMON_ID_NAME, token_path
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.size_text import human_size


def cluster_command(args: argparse.Namespace, config: StoreConfig) -> int:
    if args.url:
        raise InvalidArgumentError("tierfs cluster reads the cluster's database, not one daemon: give --config "
                                   "FILE or --metadata postgresql://... instead of --url")
    if not is_postgresql_url(config.metadata_url):
        raise InvalidArgumentError(
            "tierfs cluster reads a cluster's PostgreSQL database: give the daemons' settings "
            "(--config FILE, or --metadata postgresql://...)")
    if args.action == "drain":
        return _drain(args, config)
    if args.action == "undrain":
        daemon_id = undrain(config.metadata_url, args.daemon)
        print(json.dumps({"undrained": daemon_id}) if args.json else
              f"{daemon_id} holds its share again once the daemons rebalance (within a second)")
        return 0
    status = cluster_status(config.metadata_url, config.lease_s, credential=_host_credential(config.data_dir),
                            ca_path=config.tls_ca_path)
    if args.json:
        print(json.dumps(status.as_json(), indent=2))
    else:
        print(status_text(status), end="")
    return 0


def _host_credential(data_dir: Path) -> HostCredential | None:
    """The credentials of the cluster daemon whose data dir this is, if it is one (read,
    never created)."""
    try:
        return HostCredential((data_dir / DAEMON_ID_NAME).read_text().strip(), token_path(data_dir).read_text().strip())
    except OSError:
        return None


def _drain(args: argparse.Namespace, config: StoreConfig) -> int:
    def progress(held: list[int]) -> None:
        if not args.json:
            print(f"tierfs: still holds {len(held)} container(s)", file=sys.stderr, flush=True)

    result = drain(config.metadata_url, config.lease_s, args.daemon, args.wait, progress)
    if args.json:
        print(json.dumps(dataclasses.asdict(result) | {"moved": {container_label(c): o for c, o in result.moved.items()}},
                         indent=2))
    elif not result.still_held:
        moved = ", ".join(f"{container_label(c)} -> {owner}" for c, owner in result.moved.items())
        print(f"drained {result.daemon_id} in {result.seconds:.1f} s: {moved or 'it held no container'}")
    if result.still_held:
        print(f"tierfs: {', '.join(map(container_label, result.still_held))} of {result.daemon_id} had not moved "
              f"after {args.wait:g} s (each is flushed before it moves; the drain stays set: tierfs cluster undrain "
              f"{result.daemon_id} ends it)", file=sys.stderr)
        return 1
    return 0


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def _daemon_row(daemon: DaemonStatus) -> list[str]:
    if daemon.reachable is None:
        health = ["-", "-", "-"]
    elif not daemon.reachable:
        health = ["unreachable", "-", "-"]
    else:
        health = [human_size(daemon.flush_backlog_bytes), f"{daemon.flush_lag_s:.1f} s",
                  f"{daemon.lost_found_entries} ({human_size(daemon.lost_found_bytes)})"]
    live = ("yes, draining" if daemon.draining else "yes") if daemon.live else "no"
    return [daemon.daemon_id, daemon.url, f"{daemon.heartbeat_age_s:.1f} s ago", live, str(len(daemon.containers)),
            *health]


def _lease_text(left_s: float, state: str) -> str:
    if state == "free":
        return "free"
    return f"{left_s:.1f} s left" if state == "held" else f"expired {-left_s:.1f} s ago"


def status_text(status: ClusterStatus) -> str:
    live = [d for d in status.daemons if d.live]
    lines = [f"cluster on {status.database}: {len(live)} live daemons of {len(status.daemons)} registered, "
             f"{len(status.containers)} containers, lease {status.lease_s:g} s",
             *_table(["DAEMON", "URL", "HEARTBEAT", "LIVE", "CONTAINERS", "UNFLUSHED", "FLUSH LAG", "LOST+FOUND"],
                     [_daemon_row(d) for d in status.daemons]), ""]
    lines += _table(["CONTAINER", "OWNER", "EPOCH", "LEASE"],
                    [[container_label(c.container), c.owner or "-", str(c.epoch), _lease_text(c.lease_left_s, c.state)]
                     for c in status.containers])
    unserved = status.unserved
    lines.append("")
    lines.append(f"unserved: {', '.join(container_label(c) for c in unserved)} (appends to them wait until a "
                 "daemon takes them)" if unserved else "every container is held by a live lease")
    for daemon in status.daemons:
        if daemon.reachable is False:
            lines.append(f"{daemon.daemon_id} did not answer: {daemon.error}")
    if any(d.error == NO_CREDENTIAL for d in status.daemons):
        lines.append(NO_CREDENTIAL)
    return "\n".join(lines) + "\n"
