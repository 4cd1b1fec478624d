"""``ClusterStore``: the whole namespace served from any daemon of a cluster.

Each call goes to the store of the name's container (``container_map.container_of``):
in this process when this daemon holds the container's lease, else to the owner's
daemon, whose URL the lease registry holds, with this daemon's own credentials
(``host_credentials``; ``RemoteStore``, so an append lands once even if an answer is
lost). The root is in every container: listing it
merges theirs; store-wide calls (sync, flush, fsck, gc) go to every container.

Invariants:
- A forwarded request names its container and is served only from that container's
  store, if held here (``not_owner`` otherwise), so requests are forwarded at most once.
- While a container has no live owner (its owner died and the lease has not expired,
  or a new owner is opening it) calls wait, up to ``lease_s`` plus the opening time,
  then fail with ``container_unavailable``; nothing is attempted twice unless the
  first attempt provably did not happen (no connection, ``not_owner``, ``closed``).
- Flushed bytes of another daemon's container are read from tier-2 on this host (the
  owner gives the chunk layout, every block is CRC-checked); only the unflushed tail,
  a chunk this host cannot read, and short reads go through the owner.
- A rename or concat across containers is refused (``cross_container``, EXDEV) before
  anything changes.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from tierfs.cluster.append_forwarder import AppendForwarder
from tierfs.cluster.container_host import ContainerHost
from tierfs.cluster.container_map import container_label, container_of
from tierfs.cluster.forwarding import forwarded_request
from tierfs.cluster.host_credentials import PeerRegistry
from tierfs.cluster.leases import LeaseTable, Owner
from tierfs.cluster.statistics_sum import summed_statistics
from tierfs.contracts import names
from tierfs.contracts.api import SegmentReaderAPI, SegmentStoreAPI
from tierfs.contracts.cluster_errors import (
    ContainerUnavailableError,
    CrossContainerError,
    NotOwnerError,
)
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import (
    DaemonUnavailableError,
    ResponseLostError,
    StoreClosedError,
    single_error,
)
from tierfs.contracts.reports.fsck import FsckReport, Problem
from tierfs.contracts.reports.gc import GcReport
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.contracts.reports.statistics import StoreStatistics
from tierfs.contracts.writers import Writer, WriterSeq
from tierfs.remote.client import TierClient
from tierfs.remote.direct_read import DirectChunkReader, read_directly
from tierfs.remote.exactly_once import BytesPayload, append_exactly_once
from tierfs.remote.remote_store import RemoteStore
from tierfs.store.served import HeldFile

T = TypeVar("T")
# a read of another daemon's container at least this long takes its flushed bytes from
# tier-2 here (layout from the owner, then ranged GETs); shorter ones are one round trip
DIRECT_READ_MIN_BYTES = 256 << 10
OWNERS_TTL_S = 1.0
OPEN_ALLOWANCE_S = 20.0  # a new owner's opening (claim, metadata, replay) on top of the lease


class ClusterFence:
    """``fenced`` / ``lost_found_bytes`` over the container stores held here."""

    def __init__(self, host: ContainerHost) -> None:
        self._host = host

    @property
    def fenced(self) -> bool:
        return any(store.fence.fenced for store in self._host.stores.values())

    @property
    def lost_found_bytes(self) -> int:
        return sum(store.fence.lost_found_bytes for store in self._host.stores.values())


class RoutedReader:
    """A reader whose every read is routed (the container may move between reads)."""

    def __init__(self, cluster: ClusterStore, name: str) -> None:
        self._cluster = cluster
        self.name = name

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        return await self._cluster.read(self.name, offset, length, unconfirmed=unconfirmed)


class ClusterStore:
    """``SegmentStoreAPI`` (and what the server needs) over every container."""

    def __init__(self, config: StoreConfig, host: ContainerHost, leases: LeaseTable) -> None:
        self.config = config
        self.host = host
        self._leases = leases
        self._owners: dict[int, Owner] = {}
        self._owners_at_s = 0.0
        self._remotes: dict[tuple[str, int], RemoteStore] = {}
        self._forwarder = AppendForwarder(host.credential, read_timeout_s=2 * config.lease_s + 5.0,
                                          ca_path=config.tls_ca_path)
        self.peers = PeerRegistry(lambda: host.db_call(leases.token_digests))  # who may call this daemon
        self.fence = ClusterFence(host)
        # flushed bytes of other daemons' containers, read from tier-2 here
        self._direct = DirectChunkReader(config.chunk_store_options)
        self.growth_listeners = host.growth_listeners  # growth of the containers held here
        self.name_listeners: list[Callable[[str], None]] | None = None  # other hosts rename too

    @property
    def epoch(self) -> int:
        return max((store.epoch for store in self.host.stores.values()), default=0)

    def close(self) -> None:
        for remote in self._remotes.values():
            remote.client.close()
        self._forwarder.close()

    # ------------------------------------------------------------ routing
    async def _owner(self, container: int, refresh: bool) -> Owner | None:
        if refresh or time.monotonic() - self._owners_at_s > OWNERS_TTL_S:
            self._owners = await self.host.db_call(self._leases.owners)
            self._owners_at_s = time.monotonic()
        return self._owners.get(container)

    def _remote(self, owner: Owner) -> RemoteStore:
        key = (owner.url, owner.container)
        if key not in self._remotes:
            # an owner that does not answer within twice its lease is presumed gone: the
            # call goes to the next owner (appends: exactly once, see ``append``)
            credential = self.host.credential
            self._remotes[key] = RemoteStore(TierClient(
                owner.url, credential.token, forwarded_container=owner.container, host_id=credential.daemon_id,
                ca_path=self.config.tls_ca_path, read_timeout_s=2 * self.config.lease_s + 5.0))
        return self._remotes[key]

    async def _store_for(self, container: int, name: str, deadline_s: float) -> SegmentStoreAPI:
        forwarded = forwarded_request.get()
        if forwarded is not None:  # the sender chose the container: ours, or not_owner
            store = self.host.stores.get(forwarded)
            if store is None:
                raise NotOwnerError(name, forwarded)
            return store
        refresh = False
        while True:
            local = self.host.stores.get(container)
            if local is not None:
                return local
            owner = await self._owner(container, refresh)
            if owner is not None and owner.live and owner.daemon_id != self.host.daemon_id:
                return self._remote(owner)
            if time.monotonic() > deadline_s:
                raise ContainerUnavailableError(name, container, self._wait_s)
            with trio.move_on_after(0.2):
                await self.host.changed.wait()
            refresh = True

    @property
    def _wait_s(self) -> float:
        return self.config.lease_s + OPEN_ALLOWANCE_S

    async def _in(self, container: int, name: str, call: Callable[[SegmentStoreAPI], Awaitable[T]],
                  idempotent: bool = False) -> T:
        """``call`` on the store of ``container``; again elsewhere only when the attempt
        provably did not happen, or changes nothing (``idempotent``: reads, tails)."""
        deadline_s = time.monotonic() + self._wait_s
        while True:
            store = await self._store_for(container, name, deadline_s)
            try:
                return await call(store)
            except ResponseLostError:
                if not idempotent:
                    raise  # it may have happened: never tried twice here
                if forwarded_request.get() is not None or time.monotonic() > deadline_s:
                    raise
                self._owners_at_s = 0.0
                await trio.sleep(0.1)
            except (DaemonUnavailableError, NotOwnerError, StoreClosedError):
                if forwarded_request.get() is not None or time.monotonic() > deadline_s:
                    raise
                self._owners_at_s = 0.0
                await trio.sleep(0.1)

    async def _at(self, name: str, call: Callable[[SegmentStoreAPI], Awaitable[T]]) -> T:
        return await self._in(container_of(name, self.host.count), name, call)

    async def _read_at(self, name: str, call: Callable[[SegmentStoreAPI], Awaitable[T]]) -> T:
        """A call that changes nothing: retried on the next owner even after a lost answer."""
        return await self._in(container_of(name, self.host.count), name, call, idempotent=True)

    async def _everywhere(self, call: Callable[[SegmentStoreAPI], Awaitable[T]], idempotent: bool = True) -> list[T]:
        forwarded = forwarded_request.get()
        if forwarded is not None:  # the sender asks every container in turn: this one
            return [await self._in(forwarded, "", call, idempotent)]
        results: dict[int, T] = {}

        async def one(container: int) -> None:
            results[container] = await self._in(container, "", call, idempotent)

        with single_error():
            async with trio.open_nursery() as nursery:
                for container in range(self.host.count):
                    nursery.start_soon(one, container)
        return [results[c] for c in sorted(results)]

    def _same_container(self, operation: str, first: str, others: builtins.list[str]) -> None:
        home = container_of(names.canonical(first), self.host.count)
        for other in others:
            if container_of(names.canonical(other), self.host.count) != home:
                raise CrossContainerError(operation, first, other)

    # ------------------------------------------------------------ the API
    async def create(self, name: str, *, durability: str | None = None, make_parents: bool = False) -> SegmentInfo:
        return await self._at(name, lambda s: s.create(name, durability=durability, make_parents=make_parents))

    def id_space(self, name: str) -> int:
        """Each container numbers its own segments (``MountedStore.id_space``)."""
        return container_of(name, self.host.count)

    async def create_file(self, name: str) -> SegmentInfo:
        """The mount's create: a cluster's metadata (PostgreSQL) is durable at commit."""
        return await self.create(name)

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None,
                     writer: WriterSeq | None = None) -> int:
        """Lands once, even when an owner stops answering after the append was sent: the
        append keeps its writer identity (the caller's, else a fresh one) on every
        attempt, on whichever daemon owns the container next, and an owner that holds
        it answers with its offset (``engine.writer_marks``); one that does not appends
        it (a fenced owner commits nothing, so what it held is not in the segment)."""
        container = container_of(names.canonical(name), self.host.count)
        deadline_s = time.monotonic() + self._wait_s
        identity = writer if writer is not None else Writer().next()
        unsure = False
        while True:
            store = await self._store_for(container, name, deadline_s)
            try:
                # a remote store is the owner's that _store_for just read from the owners
                owner = self._owners.get(container) if isinstance(store, RemoteStore) else None
                if owner is not None and owner.append_url:  # its append listener: the lean path
                    return await self._forwarder.append(owner.append_url, owner.container, name,
                                                        data, expected_offset, identity)
                if isinstance(store, RemoteStore):
                    return await trio.to_thread.run_sync(functools.partial(
                        append_exactly_once, store.client, name, BytesPayload(data), expected_offset,
                        conditional=expected_offset is not None, writer=identity, maybe_landed=unsure,
                        budget_s=0.0))
                return await store.append(name, data, expected_offset=expected_offset, writer=identity)
            except ResponseLostError:
                if forwarded_request.get() is not None or time.monotonic() > deadline_s:
                    raise
                unsure = True  # sent, maybe landed: the same identity goes again
            except (DaemonUnavailableError, NotOwnerError, StoreClosedError):
                if forwarded_request.get() is not None or time.monotonic() > deadline_s:
                    raise
            self._owners_at_s = 0.0
            await trio.sleep(0.1)

    async def read(self, name: str, offset: int = 0, length: int | None = None, *,
                   unconfirmed: bool = False) -> bytes:
        async def read_from(store: SegmentStoreAPI) -> bytes:
            if isinstance(store, RemoteStore) and (length is None or length >= DIRECT_READ_MIN_BYTES):
                return await trio.to_thread.run_sync(
                    functools.partial(read_directly, self._direct, store.client, name, offset, length, unconfirmed))
            return await store.read(name, offset, length, unconfirmed=unconfirmed)
        return await self._read_at(name, read_from)

    def open_reader(self, name: str) -> SegmentReaderAPI:
        local = self.host.stores.get(container_of(names.canonical(name), self.host.count))
        return local.open_reader(name) if local is not None else RoutedReader(self, name)

    async def stat(self, name: str) -> Info:
        return await self._read_at(name, lambda s: s.stat(name))

    async def list(self, name: str = "") -> builtins.list[Info]:
        if names.canonical(name, allow_root=True) == "":
            merged = [info for part in await self._everywhere(lambda s: s.list("")) for info in part]
            return sorted(merged, key=lambda info: info.name)
        return await self._read_at(name, lambda s: s.list(name))

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        await self._at(name, lambda s: s.mkdir(name, parents=parents, exist_ok=exist_ok))

    async def rmdir(self, name: str) -> None:
        await self._at(name, lambda s: s.rmdir(name))

    async def seal(self, name: str) -> SegmentInfo:
        return await self._at(name, lambda s: s.seal(name))

    async def rewrite(self, name: str) -> SegmentInfo:
        return await self._at(name, lambda s: s.rewrite(name))

    async def hold(self, name: str) -> HeldFile | None:
        """A hold where this daemon owns the name's container (``MountedStore.hold``)."""
        local = self.host.stores.get(container_of(names.canonical(name), self.host.count))
        return await local.hold(name) if local is not None else None

    async def unseal(self, name: str) -> SegmentInfo:
        return await self._at(name, lambda s: s.unseal(name))

    async def delete(self, name: str) -> None:
        await self._at(name, lambda s: s.delete(name))

    async def rename(self, old: str, new: str) -> None:
        self._same_container("rename", old, [new])
        await self._at(old, lambda s: s.rename(old, new))

    async def sync(self, name: str | None = None) -> int:
        if name is not None:
            return await self._at(name, lambda s: s.sync(name))
        return max(await self._everywhere(lambda s: s.sync(None)))

    async def flush(self, name: str | None = None) -> None:
        if name is not None:
            await self._at(name, lambda s: s.flush(name))
        else:
            await self._everywhere(lambda s: s.flush(None))

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        return await self._read_at(name, lambda s: s.wait_for_data(name, offset, timeout_s))

    async def concat(self, target: str, sources: str | builtins.list[str], *, writer: str = "",
                     writer_seq: int | None = None) -> SegmentInfo:
        self._same_container("concat", target, [sources] if isinstance(sources, str) else list(sources))
        return await self._at(target, lambda s: s.concat(target, sources, writer=writer, writer_seq=writer_seq))

    async def set_durability(self, name: str, durability: str) -> SegmentInfo:
        return await self._at(name, lambda s: s.set_durability(name, durability))

    async def set_attributes(
        self, name: str, *, mode: int | None = None, uid: int | None = None, gid: int | None = None,
        atime_ns: int | None = None, mtime_ns: int | None = None,
    ) -> Info:
        return await self._at(name, lambda s: s.set_attributes(
            name, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns))

    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        return await self._at(name, lambda s: s.offload(name, up_to))

    async def offload_status(self, name: str) -> dict[str, Any]:
        return await self._read_at(name, lambda s: s.offload_status(name))

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        if names.canonical(name, allow_root=True) == "":  # the root's policy is every container's
            return (await self._everywhere(lambda s: s.set_policy("", assignments), idempotent=False))[0]
        return await self._at(name, lambda s: s.set_policy(name, assignments))

    async def get_policy(self, name: str) -> dict[str, Any]:
        return await self._read_at(name, lambda s: s.get_policy(name))

    async def defrag(self, name: str) -> dict[str, Any]:
        return await self._at(name, lambda s: s.defrag(name))

    async def fsck(self) -> FsckReport:
        reports = await self._everywhere(lambda s: s.fsck())
        problems = [p for r in reports for p in r.problems]
        problems += [Problem("lost+found", "", f"{path}: a journal kept when its container moved (LOST.json)")
                     for path in self.host.lost_found]
        return FsckReport(segments=sum(r.segments for r in reports), chunks=sum(r.chunks for r in reports),
                          bytes_checked=sum(r.bytes_checked for r in reports), problems=problems,
                          orphans=[o for r in reports for o in r.orphans])

    async def gc(self, *, dry_run: bool = False, older_owners: bool = False) -> GcReport:
        reports = await self._everywhere(lambda s: s.gc(dry_run=dry_run, older_owners=older_owners),
                                         idempotent=dry_run)
        first = reports[0]
        return dataclasses.replace(
            first, orphans=[o for r in reports for o in r.orphans],
            kept_young=sum(r.kept_young for r in reports), kept_in_flight=sum(r.kept_in_flight for r in reports),
            kept_newer_epoch=sum(r.kept_newer_epoch for r in reports), failed=[f for r in reports for f in r.failed],
            kept_older_owner=[o for r in reports for o in r.kept_older_owner])

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        return await self._read_at(name, lambda store: store.chunk_layout(name))

    # ------------------------------------------------------------ what the server needs

    def statistics(self) -> StoreStatistics:
        return summed_statistics([store.statistics() for store in self.host.stores.values()])

    def container_statistics(self) -> dict[str, StoreStatistics]:
        return {container_label(container): store.statistics()
                for container, store in sorted(self.host.stores.items())}

