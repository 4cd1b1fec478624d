"""Crash points for the kill -9 tests of multi-step protocols (offload attempts).

``TIERFS_CRASH_AT=<point>`` in a daemon's environment makes the process kill itself
with SIGKILL the first time it reaches that named point: the same as an operator's
``kill -9`` at exactly that step, with no chance to clean up. Unset (always, outside
tests), ``crash_point`` is one environment lookup: read when reached, never at import,
so a process forked from one that imported this module still sees its own setting.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)


def crash_point(name: str) -> None:
    if name == os.environ.get("TIERFS_CRASH_AT"):
        log.warning("crash point %s reached: killing this process with SIGKILL", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
