"""Fencing: a store that lost its tier-2 to a newer owner stops writing and deleting.

``OwnerFence`` holds this store's claim (``ownership.claims``) and watches tier-2's claims
(one LIST of ``_owner/`` and one GET per check). Once a newer claim exists (or this
epoch's claim names another owner), the store is *fenced*, for good:

- appends are refused with ``FencedError`` (the storage writer's admission check);
- nothing more is written to tier-2 and nothing is deleted from it or from the
  long-term store: both are shared with the new owner, which may reference every object
  written before it took over;
- ``on_fenced`` runs once, on the event loop (the store saves what it acknowledged but
  did not commit to tier-2 into ``lost+found``).

When tier-2 is looked at, and why that is enough:

- *periodically*: a check starts every ``check_interval_s`` (``owner_check_interval_s``,
  at most ``flush_interval_s``) after the start of the last one that passed, so a zombie
  stops acknowledging appends within one interval (plus one check) of a takeover. A
  store nobody asked to write since the last check (no append admitted or acknowledged,
  no flush waited for: ``ensure_owner`` was not called) is idle and looks only every
  ``IDLE_CHECK_INTERVALS`` intervals: an idle daemon's containers cost tier-2 a request
  pair every few seconds, not several a second each. Idleness costs no safety: the first
  append after it starts a check within one interval, so a zombie acknowledges for at
  most one interval (plus one check) after its first append past the takeover, the same
  bound; with nothing appended there is nothing to fence (unflushed bytes are flushed,
  and a flush confirms first). Only ``fenced`` (the health answer, ``tierfs_fenced``)
  learns of a takeover later while idle;
- *before a chunk write* (``confirm_recent``): a passed check that started at most
  ``check_interval_s`` ago, normally the periodic one, so a write costs no request. A
  write by a zombie in that window is harmless to the new owner: chunk names carry
  the writer's epoch, which no other owner uses, so it never overwrites an object
  another owner references (it only leaves an orphan of its own epoch);
- *before a flush commits* (``confirm_since``): a passed check that *started after
  the chunk writes completed*. So a zombie never commits a flush whose write completed
  after the takeover: such bytes stay in its tail and go to lost+found. Checks are
  shared: every flush waiting for one joins the check in flight if it started late
  enough, else the next one, so concurrent flushes (and the storage writer's batches)
  cost one check, not one each. On PostgreSQL every metadata commit is also
  epoch-guarded (``ownership.epoch_guard``), so nothing a zombie commits reaches the new owner;
- *before every delete* of a tier-2 or long-term object (``FencedStorage``,
  ``guarded_storage``): a fresh check in the deleting thread, because a delete is the
  one thing that can destroy an object the new owner references.

Objects shared with another lineage are never deleted by a store's own work either
(``shared_below_epoch``): after a takeover from another data dir (a copy, a restore)
that data dir's metadata may still reference every object of the epochs before the
takeover, including ones this store's metadata drops (defrag merging them, retention,
``rm``, an offload's hot copy). ``FencedStorage.delete`` and the long-term store's
deletes keep such an object (the metadata forgets it: it becomes an older owner's
object the orphan sweep lists); only ``delete_shared`` (``tierfs gc --older-owners``)
deletes one.

Invariants:
- The state goes one way: once fenced, always fenced (until the process ends).
- A tier-2 failure while checking never fences (the writer's own retries and the
  backlog bound handle an unreachable tier-2); it only delays the verdict, and a flush
  waiting for that check fails (and is retried) instead of committing unverified.
- Checks run in worker threads under the tier-2 limiter (deletes check in the worker
  thread that deletes); at most one shared check is in flight at a time.
- Check times are on the engine's monotonic clock (``clock.monotonic_s``).

Residual windows (docs/ARCHITECTURE.md, Fencing): a takeover landing between a check's
LIST and the commit it guards; a zombie notices within ``check_interval_s``.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import trio

from tierfs.contracts.config import StoreConfig
from tierfs.contracts.errors import FencedError, Tier2Error
from tierfs.engine.clock import monotonic_s
from tierfs.engine.object_keys import chunk_shape, offload_key_shape
from tierfs.engine.ownership.claims import CLAIM_PREFIX, OwnerClaim, OwnerClaims
from tierfs.engine.tier2.calls import StoredObject
from tierfs.engine.tier2.chunk_storage import ChunkStorage
from tierfs.engine.tier2.s3_merge import MergeCounts

log = logging.getLogger(__name__)

IDLE_CHECK_INTERVALS = 10  # an idle store looks at tier-2's claims this many intervals apart


class LongTermDeletes(Protocol):
    """The long-term store's hooks: called right before each delete, and asked whether
    a key is kept for an older lineage."""

    before_delete: Callable[[], None]
    keeps: Callable[[str], bool]


@dataclasses.dataclass
class _SharedCheck:
    """One claim check that any number of tasks wait for."""

    started_s: float
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    error: Tier2Error | None = None  # tier-2 did not answer: no verdict


class OwnerFence:
    def __init__(
        self, claim: OwnerClaim, chunk_storage: ChunkStorage, tier2_limiter: trio.CapacityLimiter,
        config: StoreConfig,
    ) -> None:
        self.claim = claim
        self._storage = chunk_storage
        self._claims = OwnerClaims(chunk_storage)
        self._limiter = tier2_limiter
        # at least once per flush interval: a zombie stops acknowledging within it
        self.check_interval_s = min(config.flush_interval_s, config.owner_check_interval_s)
        self.fenced_by: OwnerClaim | None = None  # set from any thread, read anywhere
        # returns the bytes it saved to lost+found
        self.on_fenced: Callable[[OwnerClaim], Awaitable[int]] | None = None
        self.lost_found_bytes = 0  # acknowledged bytes saved to lost+found once fenced
        self.handled = trio.Event()  # set once on_fenced has run
        self._token: trio.lowlevel.TrioToken | None = None
        self._wakeup = trio.Event()
        self.passed_started_s = -math.inf  # start of the newest check that found us the owner
        self._running: _SharedCheck | None = None
        self._asked = False  # ensure_owner was called since the last periodic check started
        self.checks = 0  # shared checks run (periodic, pre-write and pre-commit together)

    @property
    def epoch(self) -> int:
        return self.claim.epoch

    @property
    def fenced(self) -> bool:
        return self.fenced_by is not None

    def ensure_owner(self) -> None:
        """``FencedError`` if this store is known to be fenced (no I/O). Any thread;
        marks the store in use, so the periodic check runs at its full rate."""
        self._asked = True
        self._raise_if_fenced()

    def _raise_if_fenced(self) -> None:
        newer = self.fenced_by
        if newer is not None:
            raise FencedError(self.claim.epoch, newer.epoch, newer.describe())

    # ------------------------------------------------------------ checking
    def still_owner(self) -> bool:
        """A fresh look at tier-2's claims (blocking, any thread): False once a newer
        owner holds tier-2. Tier-2 errors propagate."""
        try:
            self.check_blocking()
        except FencedError:
            return False
        return True

    def check_blocking(self) -> None:
        """Look at tier-2's claims now (blocking, any thread); ``FencedError`` if a
        newer owner holds tier-2. Tier-2 errors propagate (they never fence)."""
        self._raise_if_fenced()
        current = self._claims.current()
        if current is None or self.claim.same_owner(current):
            return
        if current.epoch < self.claim.epoch:
            # claims at or above ours were deleted by hand: keep writing, say so
            log.warning("tier-2 %s: the newest owner claim is epoch %d, below this store's %d",
                        self._claims.url, current.epoch, self.claim.epoch)
            return
        self.fenced_by = current
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._wakeup.set)
            except trio.RunFinishedError:
                pass
        self._raise_if_fenced()

    async def confirm(self) -> None:
        """Check tier-2 now (or join a check that starts now); ``FencedError`` if fenced."""
        await self.confirm_since(monotonic_s())

    async def confirm_recent(self) -> None:
        """Before a chunk write: a passed check that started at most ``check_interval_s``
        ago (normally the periodic one: no request), else one now."""
        await self.confirm_since(monotonic_s() - self.check_interval_s)

    async def confirm_since(self, started_after_s: float) -> None:
        """Return once a check that started at or after ``started_after_s`` found this
        store the owner: ``FencedError`` if one found it fenced, ``Tier2Error`` if the
        check that had to decide could not read the claims. Joins the check in flight
        when it started late enough, else waits for it and runs the next one."""
        started_after_s = min(started_after_s, monotonic_s())
        while True:
            self._raise_if_fenced()
            if self.passed_started_s >= started_after_s:
                return
            running = self._running
            if running is None:
                await self._run_check()  # started now, so late enough: decides, or raises
                continue
            await running.done.wait()
            if running.error is not None and running.started_s >= started_after_s:
                raise running.error

    async def _run_check(self) -> None:
        check = _SharedCheck(monotonic_s())
        self._running = check
        self.checks += 1
        try:
            await trio.to_thread.run_sync(self.check_blocking, limiter=self._limiter)
            self.passed_started_s = max(self.passed_started_s, check.started_s)
        except Tier2Error as e:
            check.error = e
            raise
        finally:
            self._running = None
            check.done.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A check every ``check_interval_s`` after the start of the last passed one
        (a check run for a write or a commit counts); once fenced, run ``on_fenced``
        and stop. ``on_fenced`` runs shielded, also when the store closes meanwhile."""
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        retry_at_s = monotonic_s()  # the first check at once
        idle_until_s = -math.inf  # while idle: no check before this, a look each interval
        try:
            while not self.fenced:
                due_s = max(self.passed_started_s + self.check_interval_s, retry_at_s, idle_until_s)
                with trio.move_on_at(due_s):
                    await self._wakeup.wait()
                if self.fenced:
                    break
                now_s = monotonic_s()
                if not self._asked and now_s < self.passed_started_s + IDLE_CHECK_INTERVALS * self.check_interval_s:
                    idle_until_s = now_s + self.check_interval_s
                    continue
                self._asked = False  # asks from now on count for the next check
                try:
                    await self.confirm_since(due_s)
                except FencedError:
                    break
                except Tier2Error as e:
                    retry_at_s = monotonic_s() + self.check_interval_s
                    log.warning("cannot check tier-2's owner claims (will retry): %s", e)
        finally:
            with trio.CancelScope(shield=True):
                await self._handle_fenced()

    async def _handle_fenced(self) -> None:
        newer = self.fenced_by
        if self.handled.is_set() or newer is None:
            return
        log.error(
            "fenced: tier-2 %s was claimed by epoch %d (%s); this store (epoch %d) refuses "
            "appends and writes nothing more there", self._claims.url, newer.epoch,
            newer.describe(), self.claim.epoch,
        )
        try:
            if self.on_fenced is not None:
                self.lost_found_bytes += await self.on_fenced(newer)
        finally:
            self.handled.set()

    # ------------------------------------------------------------ guarding storages
    def guarded_storage(self, long_term: LongTermDeletes | None) -> FencedStorage:
        """The chunk storage the store's parts use: writes refused once fenced, deletes
        after a fresh check; the long-term store's deletes get the same check."""
        if long_term is not None:
            long_term.before_delete = self.check_blocking
            long_term.keeps = self.shared
        return FencedStorage(self._storage, self)

    # objects named with an owner epoch below this are shared with another lineage
    shared_below_epoch = 0

    def shared(self, name: str) -> bool:
        """Whether ``name`` (a chunk, a pack or an offload key) may be referenced by the
        lineage before a takeover from another data dir: never deleted by this store."""
        shape = chunk_shape(name) or offload_key_shape(name)
        shared = shape is not None and shape.epoch < self.shared_below_epoch
        if shared:
            log.info("kept %s: it is shared with the owners before the takeover from another data dir "
                     "(tierfs gc --older-owners deletes it once that data dir is gone)", name)
        return shared


RESERVED_PREFIX = "_"  # chunk names start with "s" (object_keys.chunk_name)


class FencedStorage(ChunkStorage):
    """The tier-2 chunk storage as the store's parts see it: writes only while this store
    is not known to be fenced, deletes only after a fresh claim check, lists chunks
    without the claims and backups. Every verb a backend adds must be forwarded here, writes and
    deletes through the fence."""

    def __init__(self, inner: ChunkStorage, fence: OwnerFence) -> None:
        self.inner = inner
        self._fence = fence
        self.supports_append = inner.supports_append
        self.supports_concat = inner.supports_concat
        self.supports_native_merge = inner.supports_native_merge
        self.url = inner.url
        self.label = inner.label

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        self._fence.ensure_owner()
        self.inner.write(name, offset, data)

    def read(self, name: str, start: int, end: int) -> bytes:
        return self.inner.read(name, start, end)

    def read_blocks(self, name: str, spans: Sequence[tuple[int, int]], on_block: Callable[[int, bytes], None]) -> None:
        self.inner.read_blocks(name, spans, on_block)

    def delete(self, name: str) -> None:
        # The object may be referenced by a newer owner (everything written before it
        # took over is shared): look at the claims right before deleting. One an older
        # lineage may reference is kept (see the module docstring).
        if self._fence.shared(name):
            return
        self.delete_shared(name)

    def delete_shared(self, name: str) -> None:
        """Delete ``name`` even if an older lineage may reference it (asked for)."""
        self._fence.check_blocking()
        self.inner.delete(name)

    def list(self, prefix: str = "") -> list[str]:
        # the reserved names beside the chunks: owner claims (_owner/), metadata backups (_metadata/)
        return [n for n in self.inner.list(prefix) if not n.startswith(RESERVED_PREFIX)]

    def stat(self, name: str) -> int:
        return self.inner.stat(name)

    def list_objects(self) -> builtins.list[StoredObject]:
        return [o for o in self.inner.list_objects() if not o.name.startswith(CLAIM_PREFIX)]

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        self._fence.ensure_owner()
        return self.inner.merge(name, pieces)

    def chunk_url(self, name: str) -> str:
        return self.inner.chunk_url(name)
