"""``tierfs cluster drain`` and ``undrain``: move every container off one daemon (before
its host's maintenance), or let it hold its share again.

Invariants:
- A drain is a flag on the daemon's registration, nothing more: the daemon itself gives
  each container back as balancing does (flushed, closed, released, so nothing it
  acknowledged stays behind), and the other daemons take them at their next look.
- A drain is refused when no other live daemon could take the containers, and the
  drained daemon keeps whatever no other live daemon can take (container_host.py): a
  drain never leaves a container without an owner.
- ``drain`` returns once the daemon holds no live lease and another daemon holds each
  of the containers it held, or says which it still holds when the wait ends; the flag stays until ``undrain`` or the daemon's clean stop (which
  unregisters it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tierfs.cluster.leases import LeaseTable
from tierfs.contracts.errors import InvalidArgumentError

POLL_S = 0.25


@dataclasses.dataclass(frozen=True)
class DrainResult:
    daemon_id: str
    moved: dict[int, str | None]  # container it held -> its owner now (None: not moved yet)
    still_held: list[int]  # still its own, or given back and not taken yet
    seconds: float


def _registered(table: LeaseTable, who: str) -> str:
    """The daemon id of ``who`` (an id or a URL) among the registered daemons."""
    for daemon_id, url, _age_s, _draining in table.daemons():
        if who in (daemon_id, url, url.rstrip("/")):
            return daemon_id
    raise InvalidArgumentError(f"no registered daemon {who!r} (tierfs cluster status lists them)")


def _owners(table: LeaseTable) -> dict[int, str | None]:
    """container -> the daemon holding a live lease on it (None: nobody)."""
    return {c: owner if left_s > 0 else None for c, owner, _epoch, left_s in table.leases()}


def drain(metadata_url: str, lease_s: float, who: str, wait_s: float,
          progress: Callable[[list[int]], None] | None = None) -> DrainResult:
    """Drain ``who``, then wait up to ``wait_s`` until it holds no container."""
    table = LeaseTable(metadata_url)
    try:
        daemon_id = _registered(table, who)
        live = table.live_daemons(lease_s)
        if daemon_id not in live:
            raise InvalidArgumentError(f"daemon {daemon_id} is not live (no heartbeat within {lease_s:g} s): "
                                       "its containers move to the others once its leases expire")
        if not any(not draining for other, draining in live.items() if other != daemon_id):
            raise InvalidArgumentError(f"no other live daemon could take the containers of {daemon_id} "
                                       "(start one first, or undrain one)")
        owners = _owners(table)
        before = [c for c, owner in owners.items() if owner == daemon_id]
        table.set_draining(daemon_id, True)
        started, held = time.monotonic(), before
        while time.monotonic() - started < wait_s:
            if all(owners[c] not in (None, daemon_id) for c in before):
                break  # given back, and taken
            time.sleep(POLL_S)
            owners = _owners(table)
            now_held = [c for c in before if owners[c] == daemon_id]
            if progress is not None and now_held != held:
                progress(now_held)
            held = now_held
        moved = {c: owners[c] if owners[c] != daemon_id else None for c in before}
        still_held = [c for c in before if owners[c] in (None, daemon_id)]
        return DrainResult(daemon_id, moved, still_held, time.monotonic() - started)
    finally:
        table.close()


def undrain(metadata_url: str, who: str) -> str:
    """Let ``who`` hold its share again (the daemons rebalance at their next look); its id."""
    table = LeaseTable(metadata_url)
    try:
        daemon_id = _registered(table, who)
        table.set_draining(daemon_id, False)
        return daemon_id
    finally:
        table.close()
