"""``tierfs mount`` / ``tierfs umount``: the daemon with a FUSE mount in the same loop.

The CLI (``cli/daemon_commands.py``) runs ``daemon.serve`` (the store and the HTTP API
on the data dir's socket) with ``mount_service`` as its service: pyfuse3 serves the mount
on the same trio event loop, so the API keeps working beside it. In the background (the
default, ``background_mount``) the process forks first: the parent returns once the
mount serves, or raises ``MountError`` with the child's one-line reason and exit code;
the child logs to ``<data_dir>/tierfs.log``. ``check_mountpoint`` refuses, before
anything starts, a mount point that is missing, not an empty directory, or already
mounted, and a machine without ``/dev/fuse``; ``detach_dead_mount`` first detaches a
tierfs mount left there by a daemon that died (saying so).

Invariants:
- No dead mount is left behind when the daemon dies, even by kill -9: libfuse's
  fusermount3 helper (``auto_unmount``) unmounts, and where it misjudges the moment
  our own guard (``unmount_guard``) detaches the mount once the daemon is gone.
- Unmounting (``tierfs umount``, ``fusermount3 -u``) stops the daemon cleanly (flush,
  close); SIGTERM/SIGINT unmount and stop it.
- The mount is for its owner unless ``--allow-other`` (opt-in, for shared hosts; a
  non-root owner needs ``user_allow_other`` in /etc/fuse.conf); the kernel checks
  permissions from the stored modes and owners (``default_permissions``, always on).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyfuse3
import trio
from tierfs.fuse import unmount_guard
from tierfs.fuse.operations import ATTR_TIMEOUT_S, ENTRY_TIMEOUT_S, SHORT_TIMEOUT_S, TierOperations

from tierfs.contracts.config import StoreConfig
from tierfs.server.daemon import Service, serve
from tierfs.store.served import MountedStore

log = logging.getLogger("tierfs.fuse")

LOG_NAME = "tierfs.log"
FSNAME_PREFIX = "tierfs:"  # /proc/mounts shows tierfs:<data dir> as the mount's source
FUSE_DEVICE = "/dev/fuse"
MOUNT_OPTIONS = frozenset({"subtype=tierfs", "auto_unmount"})


class MountError(Exception):
    """The mount could not be set up (bad mount point, no /dev/fuse, ...): the message
    names the cause and the fix; ``exit_code`` is the command's exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted at ``path``, also when its FUSE daemon is gone
    (``os.path.ismount`` says no then: stat fails with ENOTCONN)."""
    return _mount_source(path) is not None or (not _mounts_readable() and os.path.ismount(path))


def _mounts_readable() -> bool:
    return os.access("/proc/self/mounts", os.R_OK)


def _mount_source(path: Path) -> str | None:
    """The source (fsname) of what is mounted at ``path``, or None."""
    target = os.fsencode(os.path.abspath(path))
    try:
        with open("/proc/self/mounts", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 1 and unmount_guard.unescape(fields[1]) == target:
                    return os.fsdecode(unmount_guard.unescape(fields[0]))
    except OSError:
        pass
    return None


def mounted_data_dir(mountpoint: Path) -> Path | None:
    """The data dir of the tierfs mount at ``mountpoint`` (its fsname), or None when
    no tierfs mount is there."""
    source = _mount_source(mountpoint)
    if source is None or not source.startswith(FSNAME_PREFIX):
        return None
    return Path(source[len(FSNAME_PREFIX):])


def detach_dead_mount(mountpoint: Path) -> bool:
    """Detach a tierfs mount at ``mountpoint`` whose daemon is gone (every access fails
    with ENOTCONN: a daemon killed while another process held its FUSE socket); True if
    one was detached. Anything else mounted there is left alone."""
    if mounted_data_dir(mountpoint) is None:
        return False
    try:
        os.stat(mountpoint)
        return False  # alive: check_mountpoint refuses it
    except OSError as e:
        if e.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            return False
    done = unmount_guard.detach(mountpoint)
    if done.returncode != 0:
        raise MountError(f"{mountpoint} is a dead tierfs mount (its daemon is gone) and detaching it failed: "
                         f"{done.stderr.strip()} (as root: umount -l {mountpoint})")
    return True


def check_mountpoint(mountpoint: Path) -> None:
    if is_mount_point(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point (unmount it first: tierfs umount {mountpoint}, "
                         f"or fusermount3 -u {mountpoint})")
    if not mountpoint.exists():
        raise MountError(f"mount point {mountpoint} does not exist (create it first: mkdir -p {mountpoint})")
    if not mountpoint.is_dir():
        raise MountError(f"mount point {mountpoint} is not a directory (mount on an empty directory)")
    with os.scandir(mountpoint) as entries:
        if any(True for _ in entries):
            raise MountError(f"mount point {mountpoint} is not empty: the mount would hide what is in it "
                             "(mount on an empty directory)")
    if not os.path.exists(FUSE_DEVICE):
        raise MountError(f"FUSE is not available here: {FUSE_DEVICE} is missing (load the module: modprobe "
                         "fuse; in a container, give it the device: --device /dev/fuse --cap-add SYS_ADMIN)")
    if shutil.which("fusermount3") is None and os.getuid() != 0:
        raise MountError("fusermount3 is missing: a user needs it to mount (apt install fuse3)")


def mount_service(mountpoint: Path, *, direct_io: bool, attr_timeout_s: float | None,
                  allow_other: bool) -> Service:
    """``run_mount`` for ``mountpoint``, as the daemon's service."""
    return partial(run_mount, mountpoint, direct_io, attr_timeout_s, allow_other)


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
    notifier = operations.notifier
    # fsname is what mount(8) and /proc/mounts show as the source: the data dir
    options = {*pyfuse3.default_options, *MOUNT_OPTIONS, f"fsname={FSNAME_PREFIX}{store.config.data_dir}"}
    if allow_other:  # shared hosts: other users, checked by the kernel from the modes
        options.add("allow_other")
    try:
        pyfuse3.init(operations, str(mountpoint), options)
    except RuntimeError as e:
        stopping.set()
        raise MountError(f"cannot mount {mountpoint}: {e} (see the lines fusermount3 wrote above; "
                         "/etc/fuse.conf needs user_allow_other for --allow-other)") from None
    guard = unmount_guard.start(mountpoint)  # detaches the mount if this process dies
    store.growth_listeners.append(notifier.segment_grew)
    if store.name_listeners is not None:
        store.name_listeners.append(notifier.name_changed)
    log.info("mounted %s at %s", store.config.data_dir, mountpoint)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(notifier.run)
            nursery.start_soon(operations.rewrites.run)
            nursery.start_soon(_terminate_on, stopping)
            task_status.started()
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
    finally:
        store.growth_listeners.remove(notifier.segment_grew)
        if store.name_listeners is not None:
            store.name_listeners.remove(notifier.name_changed)
        pyfuse3.close(unmount=True)
        if guard is not None and guard.stdin is not None:
            guard.stdin.close()  # unmounted: the guard finds nothing to do and exits
        log.info("unmounted %s", mountpoint)
        stopping.set()


async def _terminate_on(stopping: trio.Event) -> None:
    await stopping.wait()
    pyfuse3.terminate()


def background_mount(
    config: StoreConfig, mountpoint: Path, *, listen: str | None, service: Service,
    describe_failure: Callable[[BaseException], tuple[int, str]],
    on_ready: Callable[[], None], on_stopped: Callable[[], None],
) -> int:
    """Fork a daemon serving the mount; return its pid once it serves. Its failure to
    start is raised here as ``MountError`` with the exit code and the one line
    ``describe_failure`` gave it. The child logs to ``<data_dir>/tierfs.log`` and calls
    ``on_ready`` once it serves, ``on_stopped`` once it stopped cleanly (their lines
    go to that log)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            answer = ready.read().decode(errors="replace")
        if answer == "ok":
            return pid
        code, _, message = answer.removeprefix("error ").partition(" ")
        if not code.isdigit():
            code, message = "1", f"the mount daemon exited before it served (see {config.data_dir / LOG_NAME})"
        raise MountError(message, int(code))
    os.close(read_end)
    os.setsid()
    status, logging_to_file = 1, False
    try:
        _daemonize_stdio(config.data_dir)
        logging_to_file = True
        trio.run(_serve_and_report, config, listen, service, write_end, on_ready)
        on_stopped()
        status = 0
    except BaseException as e:
        if logging_to_file:  # the whole story in the log; the terminal gets one line
            log.exception("the mount daemon failed")
        exit_code, message = describe_failure(e)
        _report(write_end, f"error {exit_code} {message}")
    finally:
        os._exit(status)


async def _serve_and_report(config: StoreConfig, listen: str | None, service: Service, ready_fd: int,
                            on_ready: Callable[[], None]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, config, listen=listen, service=service))
        on_ready()
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


def unmount(mountpoint: Path) -> None:
    """Unmount a tierfs mount (its daemon then flushes, closes and exits)."""
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
            return
        errors.append(result.stderr.strip() or f"{command[0]} exited with {result.returncode}")
    raise MountError(f"cannot unmount {mountpoint}: {'; '.join(errors)} (is a process still using it? "
                     f"see fuser -m {mountpoint})")
