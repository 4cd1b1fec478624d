"""Growth across hosts: a segment's owner announces each advance of its durable length
on a PostgreSQL channel (NOTIFY), and every daemon listening (LISTEN) tells its own
growth listeners within a round trip: the mount's attribute invalidation and follow
reads on hosts that do not own the segment.

Invariants:
- An announcement is a hint, never data: (segment id, name, durable length). A listener
  may hear announcements late, coalesced, or, across a lost connection, not at all; so
  consumers re-read lengths from the owner or the metadata, and after a reconnect the
  listener reports ``resync`` so they re-check everything they follow.
- Announcing never blocks an append: ``announce`` only records the newest length of a
  segment; one sender sends everything recorded since its last send in ONE statement
  (many ``pg_notify`` in a round trip), so a burst of appends costs one message per
  segment per round trip, not one per append.
- Memory is bounded by the number of segments growing between two sends.
- The listener has a connection of its own, the daemon's one LISTEN connection (on a
  connection of the pool, notifications would wait behind the stores' transactions); the
  announcer sends on a connection of the daemon's pool (``metadata.connection_pool``),
  borrowed for one statement.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import trio

from tierfs.engine.metadata.database import DEAD_PEER_DETECTION, PostgresDatabase, redacted_url

log = logging.getLogger(__name__)

CHANNEL = "tierfs_growth"
_RECONNECT_PAUSE_S = 0.5


def _connect(url: str) -> Any:
    import psycopg  # only a PostgreSQL cluster loads the driver

    return psycopg.connect(url, autocommit=True, application_name="tierfs-growth", **DEAD_PEER_DETECTION)


class GrowthAnnouncer:
    """The owner's side: ``announce`` from the event loop, ``run`` as a task."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._pending: dict[int, tuple[str, int]] = {}
        self._wake = trio.Event()
        self._db: PostgresDatabase | None = None

    def announce(self, segment_id: int, name: str, durable_length: int) -> None:
        self._pending[segment_id] = (name, durable_length)
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                batch, self._pending = self._pending, {}
                payloads = [json.dumps({"id": segment_id, "name": name, "length": length})
                            for segment_id, (name, length) in batch.items()]
                try:
                    await trio.to_thread.run_sync(self._send, payloads)
                except Exception as e:  # a hint lost: listeners resync after their reconnect
                    log.warning("growth announcements to %s not sent: %s", redacted_url(self._url),
                                type(e).__name__)
                    await trio.sleep(_RECONNECT_PAUSE_S)
        finally:
            if self._db is not None:
                self._db.close()

    def _send(self, payloads: list[str]) -> None:
        if self._db is None:
            self._db = PostgresDatabase(self._url)
        self._db.execute("SELECT pg_notify(?, payload) FROM unnest(?::text[]) AS payload", (CHANNEL, payloads))


class GrowthListener:
    """A daemon's side: a thread LISTENs and hands every announcement to ``on_growth``
    (segment id, name, durable length) and every reconnect to ``on_resync``, both
    called in the trio run that called ``run``."""

    def __init__(
        self,
        url: str,
        on_growth: Callable[[int, str, int], None],
        on_resync: Callable[[], None],
        poll_s: float = 0.5,
    ) -> None:
        self._url = url
        self._on_growth = on_growth
        self._on_resync = on_resync
        self._poll_s = poll_s
        self._stop = threading.Event()
        self.listening = trio.Event()  # set once the first LISTEN is in place

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._listen, token, abandon_on_cancel=True)
        finally:
            self._stop.set()

    def _listen(self, token: trio.lowlevel.TrioToken) -> None:
        first = True
        while not self._stop.is_set():
            try:
                conn = _connect(self._url)
            except Exception as e:
                log.warning("growth channel at %s unreachable: %s", redacted_url(self._url),
                            type(e).__name__)
                self._stop.wait(_RECONNECT_PAUSE_S)
                continue
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                trio.from_thread.run_sync(self.listening.set, trio_token=token)
                if not first:
                    trio.from_thread.run_sync(self._on_resync, trio_token=token)
                first = False
                while not self._stop.is_set():
                    for notify in conn.notifies(timeout=self._poll_s):
                        self._deliver(notify.payload, token)
                        if self._stop.is_set():
                            break
            except trio.RunFinishedError:
                return
            except Exception as e:
                log.warning("growth channel lost (%s); reconnecting", type(e).__name__)
                self._stop.wait(_RECONNECT_PAUSE_S)
            finally:
                conn.close()

    def _deliver(self, payload: str, token: trio.lowlevel.TrioToken) -> None:
        try:
            body = json.loads(payload)
            segment_id, name, length = int(body["id"]), str(body["name"]), int(body["length"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed growth announcement")
            return
        trio.from_thread.run_sync(self._on_growth, segment_id, name, length, trio_token=token)

    def stop(self) -> None:
        self._stop.set()
