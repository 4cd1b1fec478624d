"""Calling a tier-2 backend: the one table that turns backend errors into tierfs
errors and retries what is transient, and the object listing's value type.

Invariants:
- Missing object -> ``ChunkMissingError``; access denied or an invalid request ->
  ``Tier2Error`` at once; anything transient (5xx, SlowDown/503, connection errors,
  timeouts) is retried with exponential backoff and jitter (a timeout at once: a stalled
  request, not a busy store), ``Tier2Error`` only after the last attempt. Retries on
  the tier-2 path live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tierfs.contracts.errors import ChunkMissingError, InvalidArgumentError, Tier2Error

T = TypeVar("T")
log = logging.getLogger(__name__)


# 5 attempts, 50 ms doubling with jitter: rides out about 0.8 s of throttling or a
# dropped connection before the caller sees the error.
RETRY_ATTEMPTS = 5
RETRY_INITIAL_S = 0.05
_PERMANENT_ERRNOS = {errno.EINVAL, errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.ENOSPC}


def _is_transient(error: Exception) -> bool:
    if isinstance(error, (ValueError, TypeError, NotImplementedError)):
        return False
    if isinstance(error, OSError) and error.errno in _PERMANENT_ERRNOS:
        return False
    return True


def tier2_call(name: str, call: Callable[[], T], attempts: int = RETRY_ATTEMPTS, label: str = "tier-2") -> T:
    delay_s = RETRY_INITIAL_S
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except FileNotFoundError as e:
            raise ChunkMissingError(f"object {name!r} is missing from the {label}: {e}") from e
        except (Tier2Error, InvalidArgumentError):
            raise
        except PermissionError as e:
            raise Tier2Error(f"the {label} refused access to {name!r}: {e}") from e
        except Exception as e:  # any backend failure: network, 5xx, disk
            if not _is_transient(e) or attempt == attempts:
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                raise Tier2Error(
                    f"the {label} failed on {name!r}{tries}: {type(e).__name__}: {e}"
                ) from e
            if isinstance(e, TimeoutError):  # a stalled request, not a busy store: ask again now
                log.info("%s timed out on %r, retry %d: %s", label, name, attempt, e)
                continue
            log.info("%s %s on %r, retry %d in %.2f s", label, type(e).__name__, name, attempt, delay_s)
            # real time: this runs in a worker thread (no trio clock there) and waits
            # for a real backend to recover
            time.sleep(delay_s * (0.5 + random.random()))
            delay_s *= 2
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class StoredObject:
    """One object as a listing shows it; ``modified_s`` (seconds since the epoch) is
    None when the backend does not say."""

    name: str
    size_bytes: int
    modified_s: float | None


def modified_s(info: Mapping[str, Any]) -> float | None:
    """The modification time in an fsspec ``info`` dict (key and type vary by backend:
    s3fs ``LastModified`` datetime, local ``mtime`` float, memory ``created``)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.datetime.fromisoformat(value).timestamp()
            except ValueError:
                continue
    return None
