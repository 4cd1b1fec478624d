"""``tierfs serve``, ``mount``, ``umount``: the daemon, with one line when it is ready
(what it serves, where, its pid) and one when it has stopped.

``serve`` and a foreground ``mount`` run ``daemon.serve`` under a nursery that prints
the ready line once the daemon reports it serves; a background ``mount`` prints it in
the parent once the child reports the mount serves (the child's own lines go to
``<data-dir>/tierfs.log``). ``umount`` waits until the daemon has flushed, closed and
exited, so the data dir is free when it returns.

Invariants: the lines go to stderr (stdout stays for data); failures are not handled
here but raised to ``execution``, which prints them as one line with an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from tierfs.cli.failures import EXIT_FAILED, EXIT_OK, describe
from tierfs.cli.waits import WAIT_NOTICE_S, process_line
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.datadir import TOKEN_NAME, running_owner_pid, socket_path
from tierfs.contracts.errors import StoreInUseError

UMOUNT_WAIT_S = 120.0  # a clean shutdown flushes to tier-2 first; S3 may be slow
UMOUNT_POLL_S = 0.05
# A command run in-process holds the data dir for well under a second; a daemon that
# is still opening (journal recovery) shows its socket within seconds.
IN_PROCESS_HOLDER_WAIT_S = 10.0


def _say(line: str) -> None:
    print(f"tierfs: {line}", file=sys.stderr, flush=True)


def _where(config: StoreConfig, listen: str | None) -> str:
    where = f"API on {socket_path(config.data_dir)}"
    if listen:
        where += f" and http://{listen} (bearer token in {config.data_dir / TOKEN_NAME})"
    return where


def refuse_if_in_use(data_dir: Path) -> None:
    """Fail (exit 4) when a running process owns ``data_dir``, before a mount forks or a
    daemon opens anything (the lock still decides any race). A holder without the
    daemon's socket is a command running in-process (``tierfs append`` typed a moment
    before, ``tierfs serve &`` typed right after it) or a daemon still opening: it is
    given ``IN_PROCESS_HOLDER_WAIT_S`` to end or to show its socket."""
    started = time.monotonic()
    noticed = False
    while True:
        pid = running_owner_pid(data_dir)
        if pid is None or pid == os.getpid():
            return
        if socket_path(data_dir).exists() or time.monotonic() >= started + IN_PROCESS_HOLDER_WAIT_S:
            raise StoreInUseError(str(data_dir), pid)
        if not noticed and time.monotonic() - started >= WAIT_NOTICE_S:
            noticed = True
            _say(f"waiting up to {IN_PROCESS_HOLDER_WAIT_S:.0f} s for {process_line(pid)} to release "
                 f"{data_dir} (Ctrl-C to stop)")
        time.sleep(UMOUNT_POLL_S)


async def _serve_with_lines(config: StoreConfig, listen: str | None, service: Any, what: str) -> None:
    from tierfs.server.daemon import serve

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, config, listen=listen, service=service))
        _say(f"{what} (pid {os.getpid()}): {_where(config, listen)}; stop: Ctrl-C or kill {os.getpid()}")


def serve_command(args: argparse.Namespace, config: StoreConfig) -> int:
    refuse_if_in_use(config.data_dir)
    trio.run(_serve_with_lines, config, args.listen, None, f"serving {config.data_dir}")
    _say(f"stopped (pid {os.getpid()}): {config.data_dir} flushed and closed")
    return EXIT_OK


def _exit_code_and_line(error: BaseException) -> tuple[int, str]:
    failure = describe(error)
    return failure.exit_code, failure.line.removeprefix("tierfs: ")


def mount_command(args: argparse.Namespace, config: StoreConfig) -> int:
    """``mount`` (imported here, so the rest of the CLI works without FUSE)."""
    from tierfs.fuse.mount import (
        background_mount,
        check_mountpoint,
        detach_dead_mount,
        mount_service,
    )

    mountpoint = Path(args.mountpoint).expanduser().absolute()
    if detach_dead_mount(mountpoint):
        _say(f"detached a dead tierfs mount at {mountpoint} (its daemon had died)")
    check_mountpoint(mountpoint)
    refuse_if_in_use(config.data_dir)
    service = mount_service(mountpoint, direct_io=not args.page_cache, attr_timeout_s=args.attr_timeout,
                            allow_other=args.allow_other)
    what = f"mounted {config.data_dir} at {mountpoint}"
    if args.foreground:
        trio.run(_serve_with_lines, config, args.listen, service, what)
        _say(f"unmounted {mountpoint}; stopped (pid {os.getpid()}): {config.data_dir} flushed and closed")
        return EXIT_OK
    pid = background_mount(
        config, mountpoint, listen=args.listen, service=service, describe_failure=_exit_code_and_line,
        on_ready=lambda: _say(f"{what} (pid {os.getpid()}): {_where(config, args.listen)}"),
        on_stopped=lambda: _say(f"unmounted {mountpoint}; stopped (pid {os.getpid()}): {config.data_dir} "
                                "flushed and closed"))
    _say(f"{what} (pid {pid}, log in {config.data_dir / 'tierfs.log'}): {_where(config, args.listen)}; "
         f"stop: tierfs umount {mountpoint}")
    return EXIT_OK


def umount_command(args: argparse.Namespace) -> int:
    """Unmount, then wait until the mount's daemon has exited (the data dir is free)."""
    from tierfs.fuse.mount import MountError, mounted_data_dir, unmount

    mountpoint = Path(args.mountpoint).expanduser().absolute()
    data_dir = mounted_data_dir(mountpoint)
    if data_dir is None:
        raise MountError(f"{mountpoint} is not a tierfs mount point (see: grep tierfs /proc/mounts)")
    pid = running_owner_pid(data_dir)
    unmount(mountpoint)
    if pid is None:
        _say(f"unmounted {mountpoint}")
        return EXIT_OK
    deadline = time.monotonic() + UMOUNT_WAIT_S
    while running_owner_pid(data_dir) == pid:
        if time.monotonic() > deadline:
            _say(f"unmounted {mountpoint}; its daemon (pid {pid}) is still flushing after "
                 f"{UMOUNT_WAIT_S:g} s (see {data_dir / 'tierfs.log'})")
            return EXIT_FAILED
        time.sleep(UMOUNT_POLL_S)
    _say(f"unmounted {mountpoint}; its daemon (pid {pid}) flushed, closed {data_dir} and exited")
    return EXIT_OK
