"""Tenure: whether this store may acknowledge an append right now.

An acknowledgement is a promise made by the owner, so it is made only while nobody else
can be the owner. Two things end that (``Tenure.check``):

- a newer claim on tier-2 (``fencing.OwnerFence``): an explicit takeover;
- in cluster mode, the container's lease (``Lease``), held in PostgreSQL: valid until
  the renewal that last succeeded was *sent* plus ``lease_s``, minus a margin, on this
  host's monotonic clock. Another daemon may take the container only once the database
  sees the lease expired, which is later than that (the database stamps the expiry when
  it executes the renewal, after it was sent), so no other owner can exist while the
  lease is valid here. A paused process, a database that stops answering or a slow
  renewal all make the lease lapse here first: appends are then refused
  (``LeaseLapsedError``, which clients send again with the same writer identity), never
  acknowledged and dropped.

Invariants:
- Monotonic time only (``time.monotonic``): a wall-clock jump changes nothing.
- An open claims tier-2 only with a valid lease (``Lease.ensure_valid_to_claim``, just
  before the claim is written): a daemon paused while it replayed a journal wakes with
  a lapsed lease and claims nothing, instead of fencing the daemon that took the
  container meanwhile. What remains is a pause between that check and the claim's
  PUT (milliseconds, against the whole open before).
- A lease only ever moves forward (``extend``); ``on_regained`` callbacks run on the
  event loop each time a lapsed lease becomes valid again (the appender then shows the
  bytes it held back: ``Appender.on_durable``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from tierfs.contracts.cluster_errors import LeaseLapsedError, LeaseLapsedWhileOpeningError

# The part of a lease not counted on: covers the renewal's own travel, a slow event
# loop between the check and the answer, and clock rate differences with the database.
LEASE_MARGIN_FRACTION = 0.2
MIN_LEASE_MARGIN_S = 0.5


def lease_margin_s(lease_s: float) -> float:
    return max(MIN_LEASE_MARGIN_S, lease_s * LEASE_MARGIN_FRACTION)


class Lease:
    """A container's lease as this host may count on it (see the module docstring)."""

    def __init__(self, container: int, lease_s: float) -> None:
        self.container = container
        self.lease_s = lease_s
        self.valid_until_s = -math.inf
        self.on_regained: list[Callable[[], None]] = []

    def valid(self) -> bool:
        return time.monotonic() < self.valid_until_s

    def renewed(self, sent_s: float) -> None:
        """A renewal (or acquisition) sent at ``sent_s`` (monotonic) succeeded."""
        was_valid = self.valid()
        self.valid_until_s = max(self.valid_until_s, sent_s + self.lease_s - lease_margin_s(self.lease_s))
        if not was_valid and self.valid():
            for callback in list(self.on_regained):
                callback()

    def ensure_valid_to_claim(self) -> None:
        """The last step before an open claims tier-2 (``claims.take_ownership``):
        ``LeaseLapsedWhileOpeningError`` once the lease lapsed, so a daemon paused while
        it opened never fences the daemon that took the container meanwhile."""
        if not self.valid():
            raise LeaseLapsedWhileOpeningError(self.container, time.monotonic() - self.valid_until_s)

    def lapsed_error(self, name: str) -> LeaseLapsedError:
        late_s = time.monotonic() - self.valid_until_s
        return LeaseLapsedError(name, self.container, late_s)


class Fence(Protocol):
    def ensure_owner(self) -> None: ...


class Tenure:
    """The fence and, in cluster mode, the lease: ``check`` raises unless both hold."""

    def __init__(self, fence: Fence, lease: Lease | None = None) -> None:
        self._fence = fence
        self.lease = lease

    def check(self, name: str) -> None:
        """``FencedError`` or ``LeaseLapsedError`` unless this store may acknowledge now."""
        self._fence.ensure_owner()
        lease = self.lease
        if lease is not None and not lease.valid():
            raise lease.lapsed_error(name)

    def valid(self) -> bool:
        try:
            self._fence.ensure_owner()
        except Exception:  # noqa: BLE001 - fenced, whatever its class
            return False
        return self.lease is None or self.lease.valid()
