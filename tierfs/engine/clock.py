"""The wall clock the engine's policies read, replaceable while the store is open.

Offload policies, retention and the deletion lag compare wall-clock times stored in
metadata; tests move time by replacing the function (``store.clock = fake``) instead
of sleeping. Parts hold the ``WallClock`` and call it, so a replacement reaches all of
them at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class WallClock:
    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self.source = source

    def __call__(self) -> float:
        """Seconds since the epoch, from the current source."""
        return self.source()
