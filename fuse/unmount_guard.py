"""The mount's own guard against a dead mount: ``python -m tierfs.fuse.unmount_guard
PID MOUNT_ID MOUNTPOINT``, started by the mount daemon once it is mounted.

libfuse's ``auto_unmount`` helper unmounts when the daemon dies, but it decides by
opening the mount point the moment the daemon's control socket closes: a kill -9
closes that socket while the process is still exiting and its FUSE connection still
answers, so the open succeeds and the helper leaves the mount behind, dead (ENOTCONN),
in about one kill in four. The guard waits on a pipe from the daemon instead; at its
end (the daemon stopped or died) it waits until the process is gone, then detaches
the mount if that same mount is still there.

Invariants:
- It detaches only the mount it was started for (its id in ``/proc/self/mountinfo``,
  never reused while mounted): a mount made at the same place since is left alone.
- It holds none of the daemon's files but the pipe's read end (``close_fds``), so it
  never keeps the FUSE connection alive itself, and runs in its own session, so a
  signal to the daemon's process group does not take it along.
- A clean unmount leaves it nothing to do: it exits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tierfs.contracts.datadir import process_running

POLL_S = 0.05


def mount_id(mountpoint: Path) -> str | None:
    """The id of what is mounted at ``mountpoint`` (``/proc/self/mountinfo``), or None."""
    target = os.fsencode(os.path.abspath(mountpoint))
    try:
        with open("/proc/self/mountinfo", "rb") as info:
            found = None
            for line in info:
                fields = line.split()
                if len(fields) > 4 and unescape(fields[4]) == target:
                    found = fields[0].decode()  # the last one listed is the one on top
            return found
    except OSError:
        return None


def unescape(field: bytes) -> bytes:
    """A path field of ``/proc/self/mounts`` or ``mountinfo`` (the kernel escapes
    spaces, tabs, newlines and backslashes as octal)."""
    return field.replace(b"\\040", b" ").replace(b"\\011", b"\t").replace(b"\\012", b"\n").replace(b"\\134", b"\\")


def detach(mountpoint: Path) -> subprocess.CompletedProcess[str]:
    """A lazy unmount of whatever is mounted at ``mountpoint``."""
    helper = ["fusermount3", "-u", "-z"] if shutil.which("fusermount3") else ["umount", "-l"]
    return subprocess.run([*helper, str(mountpoint)], capture_output=True, text=True)


def start(mountpoint: Path) -> subprocess.Popen[bytes] | None:
    """Start the guard for the mount at ``mountpoint`` made by this process; the caller
    keeps the returned process's ``stdin`` open for as long as it serves the mount."""
    mounted = mount_id(mountpoint)
    if mounted is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "tierfs.fuse.unmount_guard", str(os.getpid()), mounted, str(mountpoint)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, start_new_session=True,
    )


def guard(daemon_pid: int, mounted: str, mountpoint: Path) -> bool:
    """Wait for the daemon to end, then detach its mount if still there; True if detached."""
    while sys.stdin.buffer.read(4096):
        pass
    while process_running(daemon_pid):
        time.sleep(POLL_S)
    if mount_id(mountpoint) != mounted:
        return False
    return detach(mountpoint).returncode == 0


if __name__ == "__main__":
    guard(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
