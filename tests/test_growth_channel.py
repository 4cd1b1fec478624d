"""Growth announcements across daemons over a real PostgreSQL (LISTEN/NOTIFY)."""

from __future__ import annotations

import psycopg
import trio

from tierfs.engine.segments.growth_channel import CHANNEL, GrowthAnnouncer, GrowthListener


class Heard:
    def __init__(self) -> None:
        self.growth: list[tuple[int, str, int]] = []
        self.resyncs = 0
        self.changed = trio.Event()

    def on_growth(self, segment_id: int, name: str, length: int) -> None:
        self.growth.append((segment_id, name, length))
        self.changed.set()

    def on_resync(self) -> None:
        self.resyncs += 1
        self.changed.set()

    async def until(self, predicate: object, timeout_s: float = 10.0) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():  # type: ignore[operator]
                self.changed = trio.Event()
                await self.changed.wait()


async def test_announcements_reach_every_listener_coalesced(postgres_url: str) -> None:
    first, second = Heard(), Heard()
    announcer = GrowthAnnouncer(postgres_url)
    listeners = [GrowthListener(postgres_url, h.on_growth, h.on_resync, poll_s=0.1) for h in (first, second)]
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(listener.run)
        nursery.start_soon(announcer.run)
        for listener in listeners:
            await listener.listening.wait()
        for length in range(1, 201):  # a burst within one event-loop turn: coalesced
            announcer.announce(7, "logs/a", length)
        announcer.announce(8, "logs/b", 5)
        for heard in (first, second):
            await heard.until(lambda h=heard: (7, "logs/a", 200) in h.growth and (8, "logs/b", 5) in h.growth)
            assert len(heard.growth) == 2  # one message per segment for the whole burst
        for listener in listeners:
            listener.stop()
        nursery.cancel_scope.cancel()


async def test_a_lost_connection_resyncs_and_bad_payloads_are_ignored(postgres_url: str) -> None:
    heard = Heard()
    listener = GrowthListener(postgres_url, heard.on_growth, heard.on_resync, poll_s=0.1)
    announcer = GrowthAnnouncer(postgres_url)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(listener.run)
        nursery.start_soon(announcer.run)
        await listener.listening.wait()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_notify(%s, 'not json')", (CHANNEL,))
            admin.execute("SELECT pg_notify(%s, %s)", (CHANNEL, '{"id": "x"}'))
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'tierfs-growth' AND query LIKE 'LISTEN%%'")
        await heard.until(lambda: heard.resyncs >= 1)
        assert heard.growth == []  # the malformed announcements were dropped, nothing else
        announcer.announce(3, "x", 10)
        await heard.until(lambda: (3, "x", 10) in heard.growth)
        listener.stop()
        nursery.cancel_scope.cancel()
