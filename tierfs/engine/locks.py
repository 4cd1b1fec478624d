"""Taking many segments' locks at once (a flush batch, a concat).

Invariant: locks are taken in the order given (callers sort by segment id, so two
holders never wait for each other) and released in reverse, also on failure; a free
lock is taken at once, without the scheduler round trip of ``acquire`` (a batch of
small files takes hundreds).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio


@asynccontextmanager
async def holding(locks: Sequence[trio.Lock]) -> AsyncIterator[None]:
    """Hold every lock of ``locks`` for the block, taken in the order given."""
    held: list[trio.Lock] = []
    try:
        for lock in locks:
            try:
                lock.acquire_nowait()
            except trio.WouldBlock:
                await lock.acquire()
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()
