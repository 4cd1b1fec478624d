"""``ContainerHost``: the containers this daemon owns, each a store of its own, held
through leases that it renews, balances and gives back.

Every tick (``lease_s / 3``, at most 1 s) the host heartbeats and renews its leases, in
a task of its own; in another, every tick and at any look (a tick, at most 0.25 s) that
finds a container free or expired (one cheap read), it takes every container whose
lease expired (nobody serves it) and balances: with ``L``
live daemons (sorted by id) and ``N`` containers, daemon ``i`` should hold
``N // L + (1 if i < N % L else 0)``; a daemon holding more gives its highest-numbered
extras back (flushed, closed, released), one holding fewer takes free or expired ones,
lowest first. A daemon that stops heartbeating (killed, host gone, paused) drops out of
the live set after ``lease_s`` and its containers are taken as their leases expire. A
drained daemon (``tierfs cluster drain``) is left out of ``L`` and holds nothing, so it
gives everything back the same way, unless no other live daemon could take it: a drain
never leaves a container without an owner.

Invariants:
- Each held container's ``Lease`` (engine/ownership/tenure.py) is valid until the last renewal
  that succeeded was sent plus ``lease_s`` minus a margin; its store acknowledges
  nothing after that. The database expires the lease later than this host stops
  counting on it, so no container ever has two owners that acknowledge.
- A container moves away from a live owner only with what it acknowledged. An owner
  whose renewals fail (the database is down, or unreachable from this host) keeps its
  stores open, refusing appends, and renews them at the same epoch once the database
  answers: the acknowledged bytes in its journal are flushed by it, not left behind.
  Another daemon takes an expired container only if its owner is dead (no heartbeat
  for ``lease_s``: ``LeaseTable.acquire`` checks it in the same statement), and only
  after its own renewals have succeeded for ``lease_s`` and a tick: after an outage of
  the database, every live owner has heartbeated again by then. A lease that could not
  be renewed at its epoch (taken by another daemon) removes the store from ``stores``
  at once, before it is closed; its commits are refused by the epoch guard anyway.
- Renewals never wait for a container being opened or given back (an open replays a
  journal and claims tier-2: seconds on a loaded host): a daemon that is alive and
  reaches the database keeps its leases, so no other daemon takes a container its
  owner still serves, acknowledging appends that would then end in lost+found.
- A container's data dir is replayed only if this daemon held the lease just before
  (lease epoch ``E - 1`` recorded in ``lease.json``): nobody else wrote the container
  since. Otherwise its journal may hold acknowledged bytes that never reached tier-2
  while another owner went on: the directory is moved, whole, to
  ``<data_dir>/lost+found/cNNN.lease-<epoch>`` with a ``LOST.json`` description, kept
  and reported, never replayed over newer data.
- A container is given back (balance) only once everything it acknowledged is flushed;
  until then its owner keeps serving it. Given back cleanly it leaves no data dir behind.
  A store fenced while it is given back (another owner claimed its tier-2) is treated
  as lost: its data dir goes to lost+found, and the daemon serves its other containers
  on (a failed flush of one container never ends the daemon).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from tierfs.cluster.container_map import (
    container_config,
    container_data_dir,
    container_label,
    container_of,
)
from tierfs.cluster.host_credentials import HostCredential, token_digest
from tierfs.cluster.leases import LeaseTable
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import TierFSError
from tierfs.engine.ownership.tenure import Lease
from tierfs.engine.segments.growth_channel import GrowthAnnouncer
from tierfs.store.facade import SegmentStore, open_store

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE_RECORD = "lease.json"
RELEASE_FLUSH_TIMEOUT_S = 30.0


def tick_s(lease_s: float) -> float:
    """How often leases are renewed: three renewals per lease at least, and at least
    every second, so a lease lapses only after ~2/3 of it without an answer."""
    return min(lease_s / 3, 1.0)


def look_s(lease_s: float) -> float:
    """How often expired leases are looked for (and the containers balanced): a failover
    waits at most this long beyond the lease itself; each look is two or three reads."""
    return min(tick_s(lease_s), 0.25)


@dataclasses.dataclass
class HeldContainer:
    container: int
    epoch: int
    lease: Lease
    release: trio.Event = dataclasses.field(default_factory=trio.Event)
    lost: bool = False  # taken by another daemon: close without giving the lease back
    closed: trio.Event = dataclasses.field(default_factory=trio.Event)


class ContainerHost:
    """The stores of the containers this daemon holds (``stores``), kept by ``run``."""

    def __init__(self, config: StoreConfig, leases: LeaseTable, count: int, daemon_id: str,
                 url: str, token: str) -> None:
        self._config = config
        self._leases = leases
        self.count = count
        self.daemon_id = daemon_id
        self._url = url
        self.credential = HostCredential(daemon_id, token)  # what this daemon shows the others
        self._token_sha256 = token_digest(token)  # what the registry keeps of it
        self.append_url = ""  # its append listener, once it serves one (registered with each heartbeat)
        self.stores: dict[int, SegmentStore] = {}
        self.held: dict[int, HeldContainer] = {}
        self.lost_found: list[Path] = []
        self._limiter = trio.CapacityLimiter(1)  # one lease statement at a time
        self._healthy_since_s: float | None = None  # renewals have all succeeded since (monotonic)
        self._balanced_at_s = -float("inf")  # the last full look (monotonic)
        self.changed = trio.Event()  # set (and replaced) whenever ``stores`` changes
        self._stopping = trio.Event()
        # told the name of a segment whose durable length grew: in a held container, or
        # (through the growth channel) in another daemon's
        self.growth_listeners: list[Callable[[str], None]] = []
        self.announcer: GrowthAnnouncer | None = None

    async def db_call(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking lease-table call in a worker thread, one at a time."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _signal_change(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold containers until ``stop``; then give every one back, flushed, and leave."""
        async with trio.open_nursery() as nursery:
            try:
                await self.db_call(self._leases.heartbeat, self.daemon_id, self._url, self._token_sha256, self.append_url)
                epochs = await self.db_call(self._leases.epochs)
                await trio.to_thread.run_sync(self._keep_followed_journals, epochs)
                nursery.start_soon(self._keep_renewing)
                await self._reclaim_own(nursery)
                await self._balance(nursery)
                task_status.started()
                while not self._stopping.is_set():
                    with trio.move_on_after(look_s(self._config.lease_s)):
                        await self._stopping.wait()
                    if not self._stopping.is_set() and await self._balance_due():
                        await self._tick(nursery)
            finally:
                with trio.CancelScope(shield=True):
                    await self._give_back_all()

    def stop(self) -> None:
        self._stopping.set()

    async def _keep_renewing(self) -> None:
        """Heartbeat and renew every tick until ``stop``, whatever ``_tick`` is doing."""
        while not self._stopping.is_set():
            await self._renew()
            with trio.move_on_after(tick_s(self._config.lease_s)):
                await self._stopping.wait()

    async def _renew(self) -> None:
        sent_s = time.monotonic()  # a lease counts from before its renewal was sent
        try:
            await self.db_call(self._leases.heartbeat, self.daemon_id, self._url, self._token_sha256, self.append_url)
            held = {c: h.epoch for c, h in self.held.items() if not h.release.is_set()}
            renewed = await self.db_call(self._leases.renew, self.daemon_id, held, self._config.lease_s)
        except TierFSError as e:
            # Keep the stores: their leases lapse here first (nothing more is acknowledged),
            # and they are renewed at the same epoch once the database answers again.
            if self._healthy_since_s is not None:
                log.warning("cannot renew container leases (appends are refused once they lapse, and go on "
                            "when the database answers): %s", e)
            self._healthy_since_s = None
            return
        if self._healthy_since_s is None:
            self._healthy_since_s = sent_s
        for container in renewed:
            held_container = self.held.get(container)
            if held_container is not None and held_container.epoch == held[container]:
                held_container.lease.renewed(sent_s)
        for container in set(held) - renewed:
            log.warning("lost container %s to another daemon", container_label(container))
            self._drop(container, lost=True)

    def _may_judge_liveness(self) -> bool:
        """Renewals have succeeded for a lease and a tick: every live daemon has had the
        time to heartbeat, so one that has not is dead."""
        since = self._healthy_since_s
        return since is not None and time.monotonic() - since >= self._config.lease_s + tick_s(self._config.lease_s)

    async def _balance_due(self) -> bool:
        """A full look every tick; between ticks only when some container is free or its
        lease expired, so a failover waits at most a look beyond the lease while a
        settled cluster costs the database one cheap read per look."""
        now_s = time.monotonic()
        due = now_s - self._balanced_at_s >= tick_s(self._config.lease_s)
        if not due:
            try:
                due = await self.db_call(self._leases.any_free_or_expired)
            except TierFSError:
                return False  # the renewals notice the database is gone; the next tick looks
        if due:
            self._balanced_at_s = now_s
        return due

    async def _tick(self, nursery: trio.Nursery) -> None:
        if self._healthy_since_s is None:
            return  # the database is not answering renewals: taking more would not help
        try:
            await self._balance(nursery)
        except TierFSError as e:
            log.warning("cannot balance containers: %s", e)

    async def _reclaim_own(self, nursery: trio.Nursery) -> None:
        """After a restart: take back at once the containers still leased to this id
        (their journals replay: nobody else held them since)."""
        owners = await self.db_call(self._leases.owners)
        for container, owner in sorted(owners.items()):
            if owner.daemon_id == self.daemon_id:
                await self._take(nursery, container)

    async def _balance(self, nursery: trio.Nursery) -> None:
        live = await self.db_call(self._leases.live_daemons, self._config.lease_s)
        # a drained daemon shares nothing while another live one can hold its share
        sharers = sorted(d for d, draining in live.items() if not draining and d != self.daemon_id)
        if not live.get(self.daemon_id, False) or not sharers:
            sharers = sorted([*sharers, self.daemon_id])
        if self.daemon_id in sharers:
            index = sharers.index(self.daemon_id)
            target = self.count // len(sharers) + (1 if index < self.count % len(sharers) else 0)
        else:
            target = 0
        # availability first: an expired lease means nobody serves that container, so
        # any daemon takes it whatever its share; the share is restored later
        rescued = False
        judge = self._may_judge_liveness()
        for container in await self.db_call(self._leases.expired, self._config.lease_s) if judge else []:
            if container not in self.held:
                await self._take(nursery, container)
                rescued = True
        active = sorted(c for c, h in self.held.items() if not h.release.is_set())
        if not rescued:
            for container in active[target:]:
                log.info("giving container %s back (balance: %d daemons share them)", container_label(container),
                         len(sharers))
                self._drop(container, lost=False)
        if len(active) < target:
            takeable = self._leases.free_or_expired if judge else self._leases.free
            for container in await self.db_call(takeable, self._config.lease_s):
                if len([h for h in self.held.values() if not h.release.is_set()]) >= target:
                    break
                if container not in self.held:
                    await self._take(nursery, container)

    async def _take(self, nursery: trio.Nursery, container: int) -> None:
        sent_s = time.monotonic()
        epoch = await self.db_call(self._leases.acquire, container, self.daemon_id, self._config.lease_s)
        if epoch is None:
            return
        lease = Lease(container, self._config.lease_s)
        lease.renewed(sent_s)
        held = HeldContainer(container, epoch, lease)
        self.held[container] = held
        try:
            store = await nursery.start(self._serve_container, held)
        except BaseException:
            self.held.pop(container, None)
            with contextlib.suppress(TierFSError):
                await self.db_call(self._leases.release, container, self.daemon_id, epoch)
            raise
        if not held.release.is_set():
            self.stores[container] = store
            self._signal_change()
        log.info("holding container %s at lease epoch %d", container_label(container), epoch)

    def _relay_growth(self, store: SegmentStore, name: str) -> None:
        for listener in self.growth_listeners:
            listener(name)
        seg = store.table.get(name)
        if seg is not None and self.announcer is not None:  # other hosts' mounts hear of it
            self.announcer.announce(seg.segment_id, name, seg.durable_length)

    def heard_growth(self, segment_id: int, name: str, durable_length: int) -> None:
        """Another daemon announced growth (``segments.growth_channel``): this host's listeners
        (the mount's kernel notifier) hear of segments of containers held elsewhere."""
        if container_of(name, self.count) not in self.stores:
            for listener in self.growth_listeners:
                listener(name)

    def resync_growth(self) -> None:
        """The growth channel reconnected: announcements made meanwhile are lost, and
        the mount's cached sizes of other hosts' segments catch up when its attribute
        timeout expires (the only bound without the channel)."""
        log.info("growth channel reconnected; sizes from other hosts refresh within the mount's attribute timeout")

    def _drop(self, container: int, *, lost: bool) -> None:
        held = self.held.get(container)
        self.stores.pop(container, None)
        self._signal_change()
        if held is not None:
            held.lost = held.lost or lost
            held.release.set()

    async def _serve_container(self, held: HeldContainer,
                               task_status: trio.TaskStatus[SegmentStore] = trio.TASK_STATUS_IGNORED) -> None:
        config = container_config(self._config, held.container)
        await trio.to_thread.run_sync(self._prepare_data_dir, config.data_dir, held.container, held.epoch)
        clean = False
        unflushed: dict[str, dict[str, Any]] = {}  # segment id -> its name and flushed length
        try:
            async with open_store(config, lease=held.lease) as store:
                record = config.data_dir / LEASE_RECORD
                record.write_text(json.dumps({"epoch": held.epoch, "daemon": self.daemon_id}))
                store.growth_listeners.append(functools.partial(self._relay_growth, store))
                task_status.started(store)
                while True:
                    await held.release.wait()
                    unflushed = {str(seg.segment_id): {"name": seg.name, "flushed": seg.flushed_length}
                                 for seg in store.table.in_memory() if seg.appended_length > seg.flushed_length}
                    if held.lost:
                        break
                    with trio.move_on_after(RELEASE_FLUSH_TIMEOUT_S):
                        try:
                            await store.flush()
                        except TierFSError as e:  # fenced meanwhile, or tier-2 or the database failing
                            log.warning("container %s: flush before giving it back failed: %s",
                                        container_label(held.container), e)
                    if store.fence.fenced:  # another owner claimed it: what this one acknowledged goes aside
                        held.lost = True
                        break
                    clean = store.statistics().unflushed_bytes == 0
                    if clean or self._stopping.is_set():
                        break
                    # A live owner never gives a container away without what it acknowledged:
                    # it could not flush (tier-2 or the database down), so it keeps serving it.
                    log.warning("container %s: not given back, its acknowledged bytes are not all flushed yet",
                                container_label(held.container))
                    held.release = trio.Event()
                    self.stores[held.container] = store
                    self._signal_change()
        finally:
            self.held.pop(held.container, None)
            held.closed.set()
        if held.lost:  # another daemon owns it: what this one acknowledged is kept aside now
            await trio.to_thread.run_sync(self._keep_aside, config.data_dir, held.container, held.epoch,
                                          held.epoch + 1, unflushed)
        elif clean:  # everything is in tier-2 and the metadata: nothing to keep here
            with contextlib.suppress(TierFSError):
                await self.db_call(self._leases.release, held.container, self.daemon_id, held.epoch)
            await trio.to_thread.run_sync(shutil.rmtree, config.data_dir, True)
        # else (stopping with bytes it could not flush): the lease is not given back; it
        # expires, and this data dir keeps the journal (lost+found once another owned it)
        log.info("closed container %s (%s)", container_label(held.container),
                 "lost" if held.lost else "given back")

    def _keep_followed_journals(self, epochs: dict[int, int]) -> None:
        """At start: a container data dir whose lease another daemon took since (its
        epoch moved on) goes to lost+found now, not when the container comes back."""
        for container, epoch in epochs.items():
            data_dir = container_data_dir(self._config.data_dir, container)
            if data_dir.exists() and _lease_record(data_dir).get("epoch") != epoch:
                self._prepare_data_dir(data_dir, container, epoch + 1)

    def _prepare_data_dir(self, data_dir: Path, container: int, epoch: int) -> None:
        """Replay only if this daemon held the lease just before ``epoch``; else keep
        the old directory in lost+found (see the module's invariants)."""
        if not data_dir.exists():
            return
        previous = _lease_record(data_dir)
        if previous.get("epoch") == epoch - 1 and previous.get("daemon") == self.daemon_id:
            return
        self._keep_aside(data_dir, container, previous.get("epoch", "unknown"), epoch)

    def _keep_aside(self, data_dir: Path, container: int, old_epoch: object, epoch: int,
                    segments: dict[str, dict[str, Any]] | None = None) -> None:
        """Move a container's data dir whose lease another daemon holds (or held) to
        ``lost+found/cNNN.lease-<epoch>`` with ``LOST.json`` (``segments``: the names and
        flushed lengths of those with unflushed bytes, when known: ``tierfs lost-found
        restore`` appends their frames again), unless its journal is empty."""
        journal = data_dir / "journal"
        if not data_dir.exists():
            return
        if not any(p.stat().st_size for p in journal.glob("*.jnl")) if journal.exists() else True:
            shutil.rmtree(data_dir)
            return
        target = self._config.data_dir / "lost+found" / f"{container_label(container)}.lease-{old_epoch}"
        if target.exists():
            target = target.with_name(f"{target.name}.{time.time_ns()}")
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the description first, whole (written aside, renamed), then the directory: a
        # crash between leaves a described data dir, never an undescribed lost+found entry
        described = data_dir / "LOST.json.tmp"
        described.write_text(json.dumps({
            "container": container, "lease_epoch": old_epoch, "taken_back_at_epoch": epoch,
            "why": "another daemon owned the container since; this journal may hold acknowledged "
                   "bytes that never reached tier-2 (kept, not replayed over newer data)",
            "segments": segments or {},
        }, indent=2))
        described.rename(data_dir / "LOST.json")
        data_dir.rename(target)
        log.warning("container %s: kept the journal of lease epoch %s in %s (not replayed)",
                    container_label(container), old_epoch, target)
        self.lost_found.append(target)

    async def _give_back_all(self) -> None:
        for container in list(self.held):
            self._drop(container, lost=False)
        for held in list(self.held.values()):
            await held.closed.wait()
        with contextlib.suppress(TierFSError):
            await self.db_call(self._leases.leave, self.daemon_id)


def _lease_record(data_dir: Path) -> dict[str, Any]:
    try:
        record = json.loads((data_dir / LEASE_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
