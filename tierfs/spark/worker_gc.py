"""The Python worker's garbage collector between Spark tasks.

PySpark reuses a Python worker for task after task and runs a full ``gc.collect()``
after each one. A full collection walks every object the collector tracks, and most of
them are the worker's imports (pyspark, pyarrow, tierfs: about 90,000 objects, 35-48 ms
of CPU a collection on the development machine), which no task ever frees: with 16
partitions per GiB that is about 0.6 ms of worker CPU per MiB read, with 64 about 2.5.
``freeze_imports`` moves the objects alive when the worker's first tierfs task starts
into the collector's permanent generation (``gc.freeze``), so the collection after each
task walks only what tasks made since.

Invariants:
- Once per process (a worker forked from another keeps its parent's frozen objects
  and freezes its own once too): one full collection first, so no garbage is frozen.
- Only objects alive at that moment are frozen. Reference counting still frees any of
  them that is dropped later; only a reference cycle among them would stay in memory,
  and module-level state (imports, caches) is what they are. Everything a task creates
  afterwards is collected as before.
- Nothing else changes: a process that runs a partition outside Spark (the tests call
  ``read_partition`` directly) has its objects frozen once the same way, which only
  leaves them out of later collections.
"""

from __future__ import annotations

import gc
import os

_frozen_in_pid: int | None = None


def freeze_imports() -> None:
    """Collect once, then freeze every object alive (first call in this process only)."""
    global _frozen_in_pid
    if _frozen_in_pid == os.getpid():
        return
    _frozen_in_pid = os.getpid()
    gc.collect()
    gc.freeze()
