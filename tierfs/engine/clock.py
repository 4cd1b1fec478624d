"""The engine's clocks: monotonic time for its own timers, a replaceable wall clock for
policies, and the nanosecond stamp records carry (``now_ns``).

Monotonic time (``monotonic_s``) is the trio run's clock. The storage writer's flush
interval and retry backoff, the age of tail entries (flush lag, the last append's time)
and the journal's VD sync interval read it, and their sleeps and timeouts use it too, so
a test that runs trio with a ``MockClock`` (pytest-trio's ``mock_clock`` or
``autojump_clock``) moves all of them at once. In production it is trio's default
clock: ``time.perf_counter()`` plus a random offset, so its readings must never be
compared with ``time.monotonic()``. It can only be read on the event loop; code in a
worker thread is handed a reading taken before the thread started (journal recovery).
Not on this clock: the appender's yield-to-other-tasks throttle, which bounds real CPU
time.

Wall-clock time (``WallClock``) is what offload policies, retention and the deletion
lag compare with times stored in metadata; tests move it by replacing the function
(``store.clock = fake``) instead of sleeping. Parts hold the ``WallClock`` and call it,
so a replacement reaches all of them at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

# Seconds on the trio run's clock (see above); only on the event loop.
monotonic_s: Callable[[], float] = trio.current_time


def now_ns() -> int:
    """Wall-clock nanoseconds: the creation and modification stamps of metadata records."""
    return time.time_ns()


class WallClock:
    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self.source = source

    def __call__(self) -> float:
        """Seconds since the epoch, from the current source."""
        return self.source()
