"""Connecting to a daemon: telling one that is not there from one too busy to accept a
connection, and waiting for the busy one.

- A Unix socket whose accept queue is full refuses ``connect`` with EAGAIN: a daemon
  is listening there, so the client retries. A socket file nobody listens on (its
  daemon died) refuses with ECONNREFUSED, and so does a live daemon between binding and
  listening or while it stops: ECONNREFUSED is retried only when the data dir's lock
  names a running process (``datadir.running_owner_pid``).
- Retries back off exponentially with jitter (``FIRST_BACKOFF_S`` doubling up to
  ``MAX_BACKOFF_S``) for at most the client's budget (``OVERLOAD_RETRY_S`` by default);
  a connection never made means nothing was sent, so every request may be retried.
- Anything else that fails to connect (no socket file, a TCP port nobody listens on)
  means no daemon, at once.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from pathlib import Path

from tierfs.contracts.datadir import running_owner_pid

log = logging.getLogger(__name__)

OVERLOAD_RETRY_S = 10.0  # a daemon that accepts nothing for this long is reported overloaded
FIRST_BACKOFF_S = 0.005  # a full accept queue often drains within milliseconds
MAX_BACKOFF_S = 0.5  # waits never grow beyond this, so a recovered daemon is seen soon
BUSY_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK})


def connect_errno(error: BaseException) -> int | None:
    """The errno of the ``OSError`` behind a connection failure (httpx wraps it)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


def refused_by_live_daemon(url: str, error: BaseException) -> bool:
    """True when ``error`` (a failed connect to ``url``) means a daemon is running
    there but did not accept the connection."""
    number = connect_errno(error)
    if number in BUSY_ERRNOS:
        return True
    if number == errno.ECONNREFUSED and url.startswith("unix://"):
        return running_owner_pid(Path(url[len("unix://"):]).parent) is not None
    return False


class ConnectBackoff:
    """The waits between connection attempts to a busy daemon, within a budget."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.started_s = time.monotonic()
        self.attempts = 1
        self._delay_s = FIRST_BACKOFF_S

    def wait(self) -> bool:
        """Sleep before the next attempt; False (without sleeping) once the budget is spent."""
        remaining_s = self.started_s + self.budget_s - time.monotonic()
        if remaining_s <= 0:
            return False
        delay_s = min(remaining_s, self._delay_s * random.uniform(0.5, 1.0))
        if self.attempts == 1:
            log.debug("the tierfs daemon did not accept a connection: retrying for up to %.1f s", self.budget_s)
        time.sleep(delay_s)
        self._delay_s = min(MAX_BACKOFF_S, self._delay_s * 2)
        self.attempts += 1
        return True

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s
