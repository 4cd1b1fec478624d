"""The daemon process's allocator: few malloc arenas, so its memory follows its budgets.

glibc gives each thread that allocates its own arena (up to 8 per core), and memory
freed into one arena is reused only by that arena's threads. The daemon's worker
threads (tier-2 calls, journal syncs, metadata commits) each touch megabytes now and
then, so every arena grows to its own high-water mark: under a mixed load that was
~160 MiB of RSS beyond every configured budget (``benchmarks mixed``). Two arenas keep
one for the event loop and one shared by the workers.

Invariant: called before the daemon starts any thread; a no-op where the C library is
not glibc (musl has no per-thread arenas), and never an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt parameter number in glibc's malloc.h
DAEMON_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = DAEMON_MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process; whether it applied."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_ARENA_MAX, arenas))
    log.debug("malloc arenas capped at %d: %s", arenas, applied)
    return applied
