"""``tierfs mount`` / ``tierfs umount``: the daemon with a FUSE mount in the same loop.

``mount_command`` runs ``daemon.serve`` (the store and the HTTP API on the data dir's
socket) with ``run_mount`` as its service: pyfuse3 serves the mount on the same trio
event loop, so the API keeps working beside it. In the background (the default) the
process forks first: the parent returns once the mount serves (or prints why it could
not), the child logs to ``<data_dir>/tierfs.log``.

Invariants:
- The mount uses ``auto_unmount``: libfuse's fusermount3 helper unmounts when the
  daemon dies, even by kill -9, so no dead mount is left behind.
- Unmounting (``tierfs umount``, ``fusermount3 -u``) stops the daemon cleanly (flush,
  close); SIGTERM/SIGINT unmount and stop it.
- The mount is for its owner unless ``--allow-other`` (opt-in, for shared hosts; a
  non-root owner needs ``user_allow_other`` in /etc/fuse.conf); the kernel checks
  permissions from the stored modes and owners (``default_permissions``, always on).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pyfuse3
import trio
from tierfs.fuse.invalidation import KernelNotifier
from tierfs.fuse.operations import ATTR_TIMEOUT_S, ENTRY_TIMEOUT_S, SHORT_TIMEOUT_S, TierOperations

from tierfs.contracts.config import StoreConfig
from tierfs.server.daemon import serve
from tierfs.store.served import MountedStore

log = logging.getLogger("tierfs.fuse")

LOG_NAME = "tierfs.log"
MOUNT_OPTIONS = frozenset({"subtype=tierfs", "auto_unmount"})


class MountError(Exception):
    """The mount could not be set up (bad mount point, no /dev/fuse, ...)."""


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted at ``path``, also when its FUSE daemon is gone
    (``os.path.ismount`` says no then: stat fails with ENOTCONN)."""
    target = os.fsencode(os.path.abspath(path))
    try:
        with open("/proc/self/mounts", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                # the kernel escapes spaces and tabs in mount points as octal
                if len(fields) > 1 and fields[1].replace(b"\\040", b" ").replace(b"\\011", b"\t") == target:
                    return True
        return False
    except OSError:
        return os.path.ismount(path)


def check_mountpoint(mountpoint: Path) -> None:
    if is_mount_point(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point")
    if not mountpoint.is_dir():
        raise MountError(f"mount point {mountpoint} is not a directory")
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: FUSE is not available here")


async def run_mount(
    mountpoint: Path,
    direct_io: bool,
    attr_timeout_s: float | None,
    allow_other: bool,
    store: MountedStore,
    stopping: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``store`` at ``mountpoint`` until unmounted or ``stopping`` is set."""
    # Entries are cached long only where the store tells of every name change
    entry_timeout_s = ENTRY_TIMEOUT_S if store.name_listeners is not None else SHORT_TIMEOUT_S
    if attr_timeout_s is None:
        attr_timeout_s = ATTR_TIMEOUT_S if store.name_listeners is not None else SHORT_TIMEOUT_S
    operations = TierOperations(store, direct_io=direct_io, attr_timeout_s=attr_timeout_s,
                                entry_timeout_s=entry_timeout_s)
    notifier = KernelNotifier(operations.inodes)
    # fsname is what mount(8) and /proc/mounts show as the source: the data dir
    options = {*pyfuse3.default_options, *MOUNT_OPTIONS, f"fsname=tierfs:{store.config.data_dir}"}
    if allow_other:  # shared hosts: other users, checked by the kernel from the modes
        options.add("allow_other")
    try:
        pyfuse3.init(operations, str(mountpoint), options)
    except RuntimeError as e:
        stopping.set()
        raise MountError(f"cannot mount {mountpoint}: {e}") from None
    store.growth_listeners.append(notifier.segment_grew)
    if store.name_listeners is not None:
        store.name_listeners.append(notifier.name_changed)
    log.info("mounted %s at %s", store.config.data_dir, mountpoint)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notifier.run)
            nursery.start_soon(_terminate_on, stopping)
            task_status.started()
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
    finally:
        store.growth_listeners.remove(notifier.segment_grew)
        if store.name_listeners is not None:
            store.name_listeners.remove(notifier.name_changed)
        pyfuse3.close(unmount=True)
        log.info("unmounted %s", mountpoint)
        stopping.set()


async def _terminate_on(stopping: trio.Event) -> None:
    await stopping.wait()
    pyfuse3.terminate()


def mount_command(
    config: StoreConfig, mountpoint: Path, *, listen: str | None, foreground: bool,
    direct_io: bool = True, attr_timeout_s: float | None = None, allow_other: bool = False,
) -> int:
    """Run the daemon with the mount; in the background unless ``foreground``."""
    mountpoint = mountpoint.absolute()
    check_mountpoint(mountpoint)
    service = partial(run_mount, mountpoint, direct_io, attr_timeout_s, allow_other)
    if foreground:
        trio.run(partial(serve, config, listen=listen, service=service))
        return 0
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            answer = ready.read().decode(errors="replace")
        if answer.startswith("ok"):
            return 0
        print(f"tierfs: {answer.strip() or 'the mount daemon exited before it served'}", file=sys.stderr)
        return 1
    os.close(read_end)
    os.setsid()
    _daemonize_stdio(config.data_dir)
    status = 1
    try:
        trio.run(_serve_and_report, config, listen, service, write_end)
        status = 0
    except BaseException as e:
        log.exception("the mount daemon failed")
        _report(write_end, f"error: {e}")
    finally:
        os._exit(status)


async def _serve_and_report(config: StoreConfig, listen: str | None, service: object, ready_fd: int) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, config, listen=listen, service=service))  # type: ignore[arg-type]
        _report(ready_fd, "ok")


def _report(fd: int, message: str) -> None:
    try:
        os.write(fd, message.encode())
        os.close(fd)
    except OSError:
        pass  # reported already, or the parent is gone


def _daemonize_stdio(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_fd = os.open(data_dir / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(null_fd)
    os.close(log_fd)


def unmount_command(mountpoint: Path) -> int:
    """Unmount a tierfs mount (the daemon then flushes, closes and exits)."""
    mountpoint = mountpoint.absolute()
    if not is_mount_point(mountpoint):
        print(f"tierfs: {mountpoint} is not a mount point", file=sys.stderr)
        return 1
    commands = [["fusermount3", "-u", str(mountpoint)]]
    if os.getuid() == 0:
        commands.append(["umount", str(mountpoint)])
    errors = []
    for command in commands:
        if shutil.which(command[0]) is None:
            errors.append(f"{command[0]} not found")
            continue
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0:
            return 0
        errors.append(result.stderr.strip() or f"{command[0]} exited with {result.returncode}")
    print(f"tierfs: cannot unmount {mountpoint}: {'; '.join(errors)}", file=sys.stderr)
    return 1
