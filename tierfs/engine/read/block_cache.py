"""Shared cache of verified 1 MiB chunk blocks, with single-flight misses.

Invariants:
- Keys are ``(chunk name, block index, block length)``: a block of a chunk that is
  still growing is cached per committed length, so a longer version never aliases a
  shorter one.
- Only blocks that passed their CRC32C check are inserted (the fetch function verifies).
- The LRU is bounded by bytes (``cachetools.LRUCache`` with ``getsizeof=len``).
- Concurrent misses on one key run the fetch once; the others wait for its result or
  its error. A run fetch (one GET for several adjacent blocks) ``claim``s all its keys
  at once, before it starts, and ``complete``s or ``fail``s each key's flight as its
  block arrives, so a reader of any block of the run waits for that block only, and
  no other fetch of it starts meanwhile. A flight is finished once, by its owner.
- Pinned keys (blocks a read is assembling right now) are made most-recently-used
  before every insertion, so read-ahead filling the cache never evicts them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence

import cachetools
import trio

from tierfs.contracts.reports.statistics import CacheStatistics


class _CountingLRU(cachetools.LRUCache[Hashable, bytes]):
    evictions = 0

    def popitem(self) -> tuple[Hashable, bytes]:
        self.evictions += 1
        return super().popitem()


class Flight:
    """One block being fetched: readers wait on ``done``, then take ``data`` or ``error``."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.data: bytes | None = None
        self.error: BaseException | None = None


class BlockCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lru = _CountingLRU(maxsize=capacity_bytes, getsizeof=len)
        self._flights: dict[Hashable, Flight] = {}
        self._pins: dict[Hashable, int] = {}
        self.prefetches = 0
        self.hits = 0
        self.misses = 0
        self.gets = 0
        self.run_gets = 0
        self.fetched_bytes = 0

    def peek(self, key: Hashable) -> bytes | None:
        return self._lru.get(key)

    def has(self, key: Hashable) -> bool:
        """Cached or being fetched right now."""
        return key in self._flights or key in self._lru

    def pin(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            count = self._pins[key] - 1
            if count:
                self._pins[key] = count
            else:
                del self._pins[key]

    def _insert(self, key: Hashable, data: bytes) -> None:
        if len(data) > self.capacity_bytes:
            return
        for pinned in self._pins:
            if pinned in self._lru:
                self._lru[pinned]  # touch: most recently used, evicted last
        self._lru[key] = data

    async def get(self, key: Hashable, fetch: Callable[[], Awaitable[bytes]]) -> bytes:
        data = self._lru.get(key)
        if data is not None:
            self.hits += 1
            return data
        flight = self._flights.get(key)
        if flight is not None:
            self.hits += 1  # served without a GET of its own
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            assert flight.data is not None
            return flight.data
        self.misses += 1
        flight = Flight()
        self._flights[key] = flight
        try:
            self.gets += 1
            data = await fetch()
            self.fetched_bytes += len(data)
            flight.data = data
            self._insert(key, data)
            return data
        except Exception as e:
            flight.error = e
            raise
        except BaseException:
            flight.error = trio.TooSlowError("the fetch of this block was cancelled")
            raise
        finally:
            del self._flights[key]
            flight.done.set()

    def claim(self, keys: Sequence[Hashable]) -> list[Flight]:
        """Flights for ``keys`` (each neither cached nor in flight: the caller checked
        with ``has`` in the same step), owned by one fetch of them all; one GET."""
        flights = []
        for key in keys:
            if key in self._flights or key in self._lru:
                raise AssertionError(f"block {key!r} is cached or in flight already")
            flight = self._flights[key] = Flight()
            flights.append(flight)
        self.misses += len(keys)
        self.gets += 1
        if len(keys) > 1:
            self.run_gets += 1
        return flights

    def complete(self, key: Hashable, flight: Flight, data: bytes) -> None:
        """A claimed block arrived (verified): cache it, wake its readers."""
        if self._flights.get(key) is not flight or flight.done.is_set():
            return  # finished already (the run failed it first)
        self.fetched_bytes += len(data)
        flight.data = data
        self._insert(key, data)
        del self._flights[key]
        flight.done.set()

    def fail(self, key: Hashable, flight: Flight, error: BaseException) -> None:
        """A claimed block will not arrive: its readers get ``error``."""
        if self._flights.get(key) is not flight or flight.done.is_set():
            return
        flight.error = error
        del self._flights[key]
        flight.done.set()

    def clear(self) -> None:
        self._lru.clear()

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            hits=self.hits,
            misses=self.misses,
            evictions=self._lru.evictions,
            used_bytes=int(self._lru.currsize),
            capacity_bytes=self.capacity_bytes,
            gets=self.gets,
            fetched_bytes=self.fetched_bytes,
            prefetches=self.prefetches,
            run_gets=self.run_gets,
        )
