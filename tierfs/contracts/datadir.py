"""Facts about a data directory that both the daemon and its clients need: where it
is by default, where the daemon's socket, TCP token and lock live.

Invariants:
- The socket is ``<data_dir>/tierfs.sock`` (beside it ``tierfs-follow.sock``, the
  daemon's lean socket for streamed follows, and ``tierfs-append.sock``, its lean
  socket for pipelined appends), the token ``<data_dir>/token`` and the
  owner's lock ``<data_dir>/LOCK``; nothing else names these paths.
- The token is generated once (``secrets.token_urlsafe``), stored owner-only (0600,
  created exclusively) and never logged.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SOCKET_NAME = "tierfs.sock"
FOLLOW_SOCKET_NAME = "tierfs-follow.sock"
APPEND_SOCKET_NAME = "tierfs-append.sock"
TOKEN_NAME = "token"
DAEMON_ID_NAME = "daemon-id"  # a cluster daemon's id (cluster/opening.py)
LOCK_NAME = "LOCK"  # flock'ed by the owner, which writes its pid into it


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/tierfs``, else ``~/.local/share/tierfs``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tierfs"


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_NAME


def follow_socket_path(data_dir: Path) -> Path:
    return data_dir / FOLLOW_SOCKET_NAME


def append_socket_path(data_dir: Path) -> Path:
    return data_dir / APPEND_SOCKET_NAME


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_NAME


def running_owner_pid(data_dir: Path) -> int | None:
    """The pid the data dir's owner wrote into its lock file if that process is
    running, else None. Only reads: the lock is never taken, so a daemon starting at
    that moment is not disturbed (a clean exit empties the file; after kill -9 the pid
    names no process, unless the system reused it)."""
    try:
        recorded = (data_dir / LOCK_NAME).read_bytes()[:32].decode("ascii", "replace").strip()
    except OSError:
        return None
    if not recorded.isdigit():
        return None
    return int(recorded) if process_running(int(recorded)) else None


def process_running(pid: int) -> bool:
    """Whether ``pid`` names a running process: a zombie (killed, not yet reaped by
    its parent) has let go of every file and lock, so it does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: running
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: what kill said
    return state not in ("Z", "X")


def load_or_create_token(data_dir: Path) -> str:
    path = token_path(data_dir)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
