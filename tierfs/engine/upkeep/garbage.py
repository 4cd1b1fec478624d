"""Garbage collection of tier-2 and long-term objects whose metadata is gone.

A metadata transaction that drops chunks (delete, retention, a replaced offload
attempt) queues their object names in the same transaction; the collector deletes the
objects in the background and then forgets the names.

Invariants:
- An object is deleted only after the metadata that referenced it was committed away,
  so a crash at any point leaves at worst an object that will be deleted again, and
  after that commit is in the metadata's backups on tier-2 (``before_delete``: the
  change log shipped), so a restore never brings back a reference to a deleted object.
- A failed delete is kept and retried on the next collection; long-term names wait
  until a long-term store is configured again.
- A pack (many segments' small chunks in one object) is never deleted here: its
  queued names are holds (``object_keys.pack_hold``) that keep it from the orphan
  sweep until their time; collecting one only forgets it.
- From before its first delete until after it forgot the names, a collection registers
  them in the ``RemovalLog``, so an orphan sweep that races it does not count them.
- Deletes run in worker threads under the tier-2 limiter.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from tierfs.contracts.errors import Tier2Error, TierFSError
from tierfs.engine.object_keys import LONG_TERM_GARBAGE_PREFIX, is_pack_name
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.engine.upkeep.removals import RemovalLog

log = logging.getLogger(__name__)


class ObjectDeleter(Protocol):
    """A store whose objects can be deleted by key (blocking)."""

    def delete(self, key: str) -> None: ...


class GarbageCollector:
    def __init__(
        self,
        catalogue: ChunkCatalogue,
        chunk_storage: ChunkStorage,
        tier2_limiter: trio.CapacityLimiter,
        long_term: ObjectDeleter | None,
        removals: RemovalLog,
    ) -> None:
        self._catalogue = catalogue
        self._removals = removals
        self.chunk_storage = chunk_storage
        self._limiter = tier2_limiter
        self._long_term = long_term
        self._nursery: trio.Nursery | None = None
        # returns once every change committed before the call is in the metadata backups
        self.before_delete: Callable[[], Awaitable[None]] = _nothing

    def bind(self, nursery: trio.Nursery | None) -> None:
        """Collections run in ``nursery`` from now on (None: not any more)."""
        self._nursery = nursery

    async def queue(self, names: list[str]) -> None:
        """Queue ``names`` for deletion and collect soon."""
        if names:
            await self._catalogue.queue_garbage(names)
            self.collect_soon()

    def collect_soon(self) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._collect_in_background)

    async def _collect_in_background(self) -> None:
        try:
            await self.collect()
        except TierFSError as e:  # the metadata database away: the next collection
            log.warning("garbage collection failed, will retry: %s", e)

    async def collect(self) -> None:
        """Delete the queued objects; forget the names of those that are gone."""
        metadata = self._catalogue.metadata
        pending = await self._catalogue.call(metadata.garbage)
        if not pending:
            return
        await self.before_delete()
        objects = [_object_of(name) for name in pending if not is_pack_name(name)]
        with self._removals.removing(objects):
            done = []
            for name in pending:
                try:
                    if name.startswith(LONG_TERM_GARBAGE_PREFIX):
                        if self._long_term is None:
                            continue  # kept until tierfs runs with --offload-to again
                        key = _object_of(name)
                        await trio.to_thread.run_sync(self._long_term.delete, key, limiter=self._limiter)
                    elif not is_pack_name(name):  # a pack's hold: forgetting it is all (object_keys.pack_hold)
                        await trio.to_thread.run_sync(self.chunk_storage.delete, name, limiter=self._limiter)
                    done.append(name)
                except Tier2Error as e:
                    log.warning("garbage collection of chunk %s failed, will retry: %s", name, e)
            if done:
                await self._catalogue.call(metadata.forget_garbage, done)


async def _nothing() -> None:
    pass


def _object_of(queued: str) -> str:
    """The tier-2 name or long-term key a queued garbage name deletes."""
    return queued.removeprefix(LONG_TERM_GARBAGE_PREFIX)
