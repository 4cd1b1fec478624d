"""Crash points: make a daemon kill itself with SIGKILL at one named step.

The seam is ``tierfs.engine.faults.crash_point(name)``: a process whose environment has
``TIERFS_CRASH_AT=<name>`` sends itself SIGKILL the first time it reaches that point
(after logging ``crash point <name> reached``), exactly as an operator's ``kill -9``
would at that step. This module builds that environment and waits for the crash; the
points themselves are named where they are reached (the offloader's attempt protocol:
``OFFLOAD_CRASH_POINTS``).

Invariants:

- The variable is read once, when ``tierfs.engine.faults`` is imported, so it only
  works for a new process: pass ``crash_environment(point)`` to ``start_daemon`` or
  ``Mount`` (never set it in the test process itself, which would then die).
- ``wait_for_crash`` sends no signal: whatever ends the process, the caller sees its
  real exit code (``-SIGKILL`` after a crash point) and its whole stderr.
"""

from __future__ import annotations

from tierfs.testing.harness import STOP_TIMEOUT_S, TierProcess

CRASH_AT_ENV = "TIERFS_CRASH_AT"  # read by tierfs.engine.faults

# The steps of one offload attempt, in order (tierfs/offload/offloader.py).
OFFLOAD_CRASH_POINTS: tuple[str, ...] = (
    "offload.attempt_recorded",  # UUID in metadata, nothing uploaded
    "offload.data_uploaded",  # data object uploaded, no index
    "offload.index_uploaded",  # both objects uploaded, not marked complete
    "offload.completed",  # marked complete, chunk-store copy still there
    "offload.hot_deleted",  # chunk-store copy deleted, not yet recorded
)

# Defrag of one run (tierfs/engine/upkeep/defrag.py).
DEFRAG_CRASH_POINTS: tuple[str, ...] = (
    "defrag.merged",  # merged object written and verified, metadata unchanged
    "defrag.swapped",  # records swapped, old objects queued, not yet collected
)


# A flush: the chunk object is written to tier-2, its metadata commit has not run
# (tierfs/engine/flush/storage_writer.py); the object is an orphan after the restart.
FLUSH_CHUNK_WRITTEN = "flush.chunk_written"


def crash_environment(point: str) -> dict[str, str]:
    """The environment variables for a daemon that dies at ``point``."""
    if not point or point != point.strip():
        raise ValueError(f"a crash point is a non-empty name without spaces around it: {point!r}")
    return {CRASH_AT_ENV: point}


def wait_for_crash(process: TierProcess, timeout_s: float = STOP_TIMEOUT_S) -> tuple[int, str]:
    """Wait for a process started with ``crash_environment`` to end by itself: its exit
    code and whole stderr. If it is still running after ``timeout_s`` (the point was
    never reached) it is killed and ``HarnessError`` raised."""
    return process.wait(timeout_s)
