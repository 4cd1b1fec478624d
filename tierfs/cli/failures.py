"""Every failure of a ``tierfs`` command as one line naming the cause and the fix, and its
exit code (``describe``). The one place exceptions become what a terminal shows.

- Exception groups (trio nurseries, hypercorn's) are opened: the line names the error
  inside, never "Exceptions from Trio nursery".
- tierfs errors keep their message and stable code (``tierfs: ... (invalid_name)``)
  and their exit code (``EXIT_CODES``: in use 4, owned elsewhere 5, no space 6).
- Operating-system errors name the file or address and what to do (permission denied,
  address in use, no such file).
- Anything else is a bug: one line saying so and that ``-v`` shows the traceback.

Invariant: imports only the standard library and contracts, so the mount's background
child (fuse/mount.py gets ``describe`` passed in) and the parser can use it cheaply.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from tierfs.contracts.datadir import socket_path
from tierfs.contracts.errors import StoreInUseError, TierFSError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DAMAGED, EXIT_IN_USE, EXIT_OWNED_ELSEWHERE, EXIT_NO_SPACE = range(7)
EXIT_INTERRUPTED = 130  # as a shell reports a command ended by SIGINT
# errors with an exit code of their own; every other TierFSError exits EXIT_FAILED
EXIT_CODES = {"in_use": EXIT_IN_USE, "owned_elsewhere": EXIT_OWNED_ELSEWHERE, "no_space": EXIT_NO_SPACE,
              "journal_corrupt": EXIT_DAMAGED, "metadata_damaged": EXIT_DAMAGED}


# what to do, for errors whose message says what happened but not what to check
HINTS = {
    "tier2": "check that tier-2 is reachable: its URL, --tier2-endpoint-url or --offload-endpoint-url, "
             "and the credentials (AWS_ACCESS_KEY_ID, ~/.aws)",
    "metadata_unavailable": "check that the PostgreSQL server of --metadata / TIERFS_METADATA runs and "
                            "accepts this user",
}


@dataclass(frozen=True)
class Failure:
    message: str  # one line, without the "tierfs: " prefix or the code
    exit_code: int
    code: str  # the stable error code (tierfs's own, or "os_error", "bug", ...)
    is_tierfs_code: bool = False  # the code is tierfs's (shown after the message, as the API's)

    @property
    def line(self) -> str:
        """What a terminal shows: ``tierfs: MESSAGE (code)``."""
        return f"tierfs: {self.message}" + (f" ({self.code})" if self.is_tierfs_code else "")


def leaves(error: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, or ``error`` itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def main_error(error: BaseException) -> BaseException:
    """The error a group is about: the first tierfs error, else the first that is not a
    cancellation or an interrupt, else the first."""
    found = leaves(error)
    for wanted in (TierFSError, Exception):
        for leaf in found:
            if isinstance(leaf, wanted) and type(leaf).__name__ != "Cancelled":
                return leaf
    return found[0]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _in_use(error: StoreInUseError) -> str:
    who = f"pid {error.pid}" if error.pid else "another process"
    if socket_path(Path(error.data_dir)).exists():
        return (f"data directory {error.data_dir} is in use by {who}: a tierfs daemon serves it (commands go "
                "through it; stop it first to serve or mount it, or pick another --data-dir)")
    return (f"data directory {error.data_dir} is in use by {who}: a tierfs command has it open without a "
            "daemon (wait for it to end, or start `tierfs serve` first so that commands share it)")


def _os_error(error: OSError) -> tuple[str, int]:
    where = error.filename if error.filename is not None else ""
    reason = error.strerror or str(error)
    if error.errno == errno.EADDRINUSE:
        return (f"cannot listen: {_one_line(str(error))} (another process listens there: "
                "stop it or pick another --listen HOST:PORT)"), EXIT_FAILED
    if error.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen: {_one_line(str(error))} (this host has no such address: "
                "use 127.0.0.1 or one of its own)"), EXIT_FAILED
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{reason}: {where} (run as the user who owns it, fix its permissions, or pick "
                "another --data-dir)"), EXIT_FAILED
    if error.errno == errno.ENOSPC:
        return f"{reason}: {where} (free space on that disk)", EXIT_NO_SPACE
    if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
        return f"{reason}: {where} (check the path)", EXIT_FAILED
    if error.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT):
        return f"{reason}: {where or _one_line(str(error))} (is the server running there?)", EXIT_FAILED
    return _one_line(f"{reason}: {where}" if where else str(error)), EXIT_FAILED


def describe(error: BaseException) -> Failure:
    """One line and an exit code for ``error`` (a group is described by its main error)."""
    error = main_error(error)
    if isinstance(error, KeyboardInterrupt):
        return Failure("interrupted", EXIT_INTERRUPTED, "interrupted")
    if isinstance(error, StoreInUseError):
        return Failure(_in_use(error), EXIT_IN_USE, error.code)
    if isinstance(error, TierFSError):  # the stable code too: the same as the HTTP API's
        message = _one_line(str(error))
        if error.code in HINTS:
            message += f" ({HINTS[error.code]})"
        return Failure(message, EXIT_CODES.get(error.code, EXIT_FAILED), error.code, True)
    exit_code = getattr(error, "exit_code", None)
    if isinstance(exit_code, int):  # errors that know their exit code (fuse.mount.MountError)
        return Failure(_one_line(str(error)), exit_code, "failed")
    if isinstance(error, OSError):
        message, exit_code = _os_error(error)
        return Failure(message, exit_code, "os_error")
    name = type(error).__name__
    return Failure(f"unexpected {name}: {_one_line(str(error)) or 'no message'} (a bug in tierfs: "
                   "run it again with -v for the traceback and report it)", EXIT_FAILED, "bug")
