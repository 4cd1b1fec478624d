"""``open_cluster``: a daemon joins the cluster of its PostgreSQL database.

Invariants:
- One daemon per data dir (the data dir's ``LOCK``), with a stable id
  (``<data_dir>/daemon-id``), so a restarted daemon takes back the containers still
  leased to it and replays their journals.
- The cluster's tables and the containers' schemas exist before any lease is taken;
  the container count is the cluster's, fixed at creation.
- Leaving the block gives every container back (flushed) and unregisters the daemon,
  so the others take them over at once instead of after the lease.
- Growth crosses hosts on the database's growth channel: held containers announce it,
  every daemon listens (``engine/segments/growth_channel.py``); a hint for the mount, never data.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from tierfs.cluster.container_host import ContainerHost
from tierfs.cluster.leases import LeaseTable
from tierfs.cluster.router import ClusterStore
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.datadir import DAEMON_ID_NAME
from tierfs.engine.ownership.dir_lock import DataDirLock
from tierfs.engine.segments.growth_channel import GrowthAnnouncer, GrowthListener


def daemon_id_of(data_dir: Path) -> str:
    """This data dir's daemon id, created once."""
    path = data_dir / DAEMON_ID_NAME
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        daemon_id = f"{uuid.uuid4().hex[:12]}"
        path.write_text(daemon_id + "\n")
        return daemon_id


@contextlib.asynccontextmanager
async def open_cluster(config: StoreConfig, url: str, token: str, append_url: str = "") -> AsyncIterator[ClusterStore]:
    """Join the cluster as the daemon reachable at ``url`` with ``token`` (and appends at
    ``append_url``, ``tcp://HOST:PORT``, when it serves an append listener)."""
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = DataDirLock(config.data_dir)
    lock.acquire()
    try:
        leases = await trio.to_thread.run_sync(LeaseTable, config.metadata_url)
        try:
            count = await trio.to_thread.run_sync(leases.set_up, config.containers)
            host = ContainerHost(config, leases, count, daemon_id_of(config.data_dir), url, token)
            host.append_url = append_url
            store = ClusterStore(config, host, leases)
            host.announcer = GrowthAnnouncer(config.metadata_url)
            listener = GrowthListener(config.metadata_url, host.heard_growth, host.resync_growth)
            channel = trio.CancelScope()

            async def growth_channel(announcer: GrowthAnnouncer) -> None:
                with channel:
                    async with trio.open_nursery() as both:
                        both.start_soon(announcer.run)
                        both.start_soon(listener.run)

            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(growth_channel, host.announcer)
                    await nursery.start(host.run)
                    try:
                        yield store
                    finally:
                        host.stop()  # host.run gives every container back, then returns
                        listener.stop()
                        channel.cancel()
            finally:
                store.close()
        finally:
            leases.close()
    finally:
        lock.release()
