"""The one place where errors become errno values for the kernel.

Invariants:
- Every FUSE handler of ``TierOperations`` is wrapped by ``fuse_errors``, so a handler
  raises nothing but ``pyfuse3.FUSEError``: a tierfs error becomes the errno of its
  ``code`` (``ERRNO_BY_CODE``), an OSError keeps its errno, and anything unexpected
  becomes EIO plus one log line with the traceback; the mount keeps serving.
- Cancellation (``trio.Cancelled``, KeyboardInterrupt: BaseExceptions) is never swallowed.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from tierfs.contracts.errors import TierFSError

log = logging.getLogger("tierfs.fuse")

ERRNO_BY_CODE: dict[str, int] = {
    "invalid_name": errno.EINVAL,
    "name_too_long": errno.ENAMETOOLONG,
    "invalid_argument": errno.EINVAL,
    "too_large": errno.EFBIG,
    "not_found": errno.ENOENT,
    "exists": errno.EEXIST,
    "not_a_directory": errno.ENOTDIR,
    "is_a_directory": errno.EISDIR,
    "not_empty": errno.ENOTEMPTY,
    "bad_offset": errno.EPERM,  # a write anywhere but at the end: append-only
    "sealed": errno.EPERM,
    "append_only": errno.EPERM,
    "unauthorized": errno.EACCES,  # a daemon refused this host's token (a forwarded call)  # a rewrite where the policy does not allow it
    "out_of_range": errno.EINVAL,
    "invalid_range": errno.EINVAL,
    "truncated": errno.ENODATA,  # retention deleted these bytes from the head
    "already_running": errno.EBUSY,
    "already_committed": errno.EALREADY,
    "already_appended": errno.EALREADY,
    "corrupt": errno.EIO,
    "backlog_full": errno.ENOSPC,  # the unflushed backlog is at its bound
    "no_space": errno.ENOSPC,  # the journal disk is full
    "in_use": errno.EBUSY,
    "closed": errno.ESHUTDOWN,
    "tier2": errno.EIO,
    "chunk_missing": errno.EIO,
    "conflict": errno.EAGAIN,
    "journal_corrupt": errno.EIO,
    "metadata_damaged": errno.EIO,
    "unavailable": errno.ENOTCONN,  # a daemon the call needed is not running
    "metadata_unavailable": errno.EIO,  # the PostgreSQL metadata database does not answer
    "metadata_version": errno.EIO,
    "wrong_tier2": errno.EBUSY,
    "daemon_overloaded": errno.EAGAIN,  # a daemon the call needed is running but did not accept it
    "response_lost": errno.EIO,  # a daemon's answer was lost: the outcome is unknown
    "internal": errno.EIO,
    "owned_elsewhere": errno.EBUSY,
    "fenced": errno.EROFS,  # another owner took tier-2 over: nothing more is written here
    "no_backup": errno.ENOENT,
    "bad_metadata": errno.EINVAL,
    "store_not_empty": errno.ENOTEMPTY,
    "cross_container": errno.EXDEV,  # mv copies across containers, as across file systems
    "container_unavailable": errno.EAGAIN,  # failover: no owner for the container yet
    "not_owner": errno.EAGAIN,
    "lease_lapsed": errno.EAGAIN,  # the owner could not renew its lease in time: try again
}

P = ParamSpec("P")
T = TypeVar("T")


def errno_of(error: BaseException) -> int:
    """The errno the kernel gets for ``error``."""
    if isinstance(error, pyfuse3.FUSEError):
        return error.errno
    if isinstance(error, TierFSError):
        return ERRNO_BY_CODE.get(error.code, errno.EIO)
    if isinstance(error, OSError) and error.errno:
        return error.errno
    return errno.EIO


def fuse_errors(handler: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Wrap a FUSE handler so it raises only ``FUSEError`` (see the module docstring)."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as caught:
            error: BaseException = caught
            while isinstance(error, BaseExceptionGroup) and error.exceptions:
                error = error.exceptions[0]  # parallel tasks: report the first failure
            if isinstance(error, (TierFSError, OSError)):
                log.debug("%s: %s", handler.__name__, error)
            else:
                log.exception("%s failed unexpectedly; answering EIO", handler.__name__)
            raise pyfuse3.FUSEError(errno_of(error)) from None

    return wrapper
