"""Running a parsed ``tierfs`` command (``execute``): the configuration, the store or
daemon it runs against, and the one place errors become one line and an exit code.

Where a store command runs: ``--url`` (or ``TIERFS_URL`` when no ``--data-dir`` is
given) names a daemon to talk to; otherwise the daemon serving the data dir if one
answers on its socket, else the engine in-process. A daemon that is starting (it holds
the data dir's lock, its socket is not up yet: ``tierfs serve &`` a moment ago) is
waited for, so a command typed right after it goes through it instead of failing
"in use".

Invariants:
- Every failure ends in one line on stderr (``failures.describe``) and its exit code;
  ``-v`` adds the traceback before it. ``--json`` makes that line a JSON object.
- What a command does not need is not imported (``tests/test_import_hygiene.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tierfs.cli.failures import EXIT_OK, describe, main_error
from tierfs.cli.waits import WAIT_NOTICE_S, process_line
from tierfs.contracts.config import StoreConfig, load_config
from tierfs.contracts.datadir import running_owner_pid, socket_path
from tierfs.contracts.errors import DaemonUnavailableError, InvalidArgumentError, StoreInUseError

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

STARTING_DAEMON_WAIT_S = 30.0  # a daemon answers within ~1 s of taking the lock; 30 s rides out a loaded host
STARTING_DAEMON_POLL_S = 0.05
# commands that own the data dir themselves (they never go through a daemon)
DATA_DIR_COMMANDS = ("serve", "mount", "umount", "takeover", "owner", "restore", "metadata", "completion")


def config_from_args(args: argparse.Namespace) -> StoreConfig:
    return load_config(
        {
            "data_dir": args.data_dir,
            "tier2_url": args.tier2,
            "tier2_endpoint_url": args.tier2_endpoint_url,
            "metadata_url": args.metadata,
            "offload_url": args.offload_to,
            "offload_endpoint_url": args.offload_endpoint_url,
            "offload_deletion_lag_s": args.deletion_lag,
            "durability": args.durability,
            "takeover": args.takeover or args.command == "takeover" or None,
            "repair_journal": getattr(args, "repair", False) or None,
            "tls_cert_path": getattr(args, "tls_cert", None),
            "tls_key_path": getattr(args, "tls_key", None),
            "tls_ca_path": args.tls_ca,
        },
        config_file=args.config,
    )


def named_daemon_url(args: argparse.Namespace) -> str | None:
    """The daemon a store command must talk to by URL: ``--url``, else ``TIERFS_URL``
    unless a data dir was named on the command line."""
    if args.url:
        return str(args.url)
    if args.data_dir is None and os.environ.get("TIERFS_URL"):
        return os.environ["TIERFS_URL"]
    return None


def client_at(url: str, ca_path: str = "") -> TierClient:
    from tierfs.remote.client import TierClient

    client = TierClient(url, ca_path=ca_path)
    try:
        client.health()
    except BaseException:
        client.close()
        raise
    return client


def daemon_client(data_dir: Path) -> TierClient | None:
    """A client of the daemon serving ``data_dir``, or None when none answers. Without
    its socket file no daemon serves, and the HTTP client is not even imported."""
    if not socket_path(data_dir).exists():
        return None
    from tierfs.remote.client import connect_if_serving

    return connect_if_serving(data_dir)


def _starting_daemon_client(data_dir: Path) -> TierClient | None:
    """The data dir's lock is held: wait while its holder runs until its socket answers
    (a daemon starting); None if it stops or never answers."""
    started = time.monotonic()
    noticed = False
    while (pid := running_owner_pid(data_dir)) is not None and time.monotonic() < started + STARTING_DAEMON_WAIT_S:
        client = daemon_client(data_dir)
        if client is not None:
            return client
        if not noticed and time.monotonic() - started >= WAIT_NOTICE_S:
            noticed = True
            print(f"tierfs: waiting up to {STARTING_DAEMON_WAIT_S:.0f} s for {process_line(pid)}, which holds "
                  f"{data_dir}, to answer as a daemon (Ctrl-C to stop; a command that holds it, such as "
                  "tail -f without a daemon, keeps it: run tierfs serve so commands share it)",
                  file=sys.stderr, flush=True)
        time.sleep(STARTING_DAEMON_POLL_S)
    return None


async def _run_store_command(args: argparse.Namespace, config: StoreConfig) -> int:
    from tierfs.cli.commands.store_commands import COMMANDS

    handler = COMMANDS[args.command]
    url = named_daemon_url(args)
    if url is not None:
        client: TierClient | None = await trio.to_thread.run_sync(client_at, url, config.tls_ca_path)
    else:
        client = await trio.to_thread.run_sync(daemon_client, config.data_dir)
    if client is not None and config.repair_journal:
        client.close()  # a daemon that serves the data dir opened it: its journal replayed whole
        raise InvalidArgumentError(f"a tierfs daemon serves {config.data_dir}, so its journal is whole: "
                                   "run tierfs fsck without --repair, or stop the daemon first")
    if client is None and config.containers:  # a cluster's containers are opened by their owners only
        raise DaemonUnavailableError(
            f"no tierfs daemon serves {config.data_dir}: in cluster mode (containers = {config.containers}) "
            "commands go through a daemon (start one: tierfs serve --listen HOST:PORT)")
    if client is None:
        from tierfs.store.facade import open_store

        for attempt in range(2):
            async with contextlib.AsyncExitStack() as stack:
                try:
                    store = await stack.enter_async_context(open_store(config, interruptible=True))
                except BaseException as e:
                    if not isinstance(main_error(e), StoreInUseError):
                        raise
                    # a daemon took the lock: it may be starting (tierfs serve & a moment ago)
                    client = await trio.to_thread.run_sync(_starting_daemon_client, config.data_dir)
                    if client is None:
                        if attempt == 0 and running_owner_pid(config.data_dir) is None:
                            continue  # the holder was a command, and it ended: open it now
                        raise
                else:
                    return await handler(args, store)
            break
    assert client is not None
    from tierfs.remote.remote_store import RemoteStore

    try:
        return await handler(args, RemoteStore(client))
    finally:
        client.close()


def _dispatch(args: argparse.Namespace) -> int:
    if args.url and args.command in DATA_DIR_COMMANDS:
        raise InvalidArgumentError(f"tierfs {args.command} works on a data dir, not through a daemon: "
                                   "give --data-dir instead of --url")
    if args.command == "umount":
        from tierfs.cli.commands.daemon import umount_command

        return umount_command(args)
    config = config_from_args(args)
    if args.command in ("serve", "mount"):
        from tierfs.cli.commands import daemon as daemon_commands
        from tierfs.server.process_memory import limit_malloc_arenas

        limit_malloc_arenas()  # before any thread: the daemon's memory follows its budgets
        command = daemon_commands.serve_command if args.command == "serve" else daemon_commands.mount_command
        return command(args, config)
    from tierfs.cli.commands.ownership import OWNERSHIP_COMMANDS

    if args.command in OWNERSHIP_COMMANDS:
        return OWNERSHIP_COMMANDS[args.command](args, config)
    if args.command == "cluster":
        from tierfs.cli.commands.cluster import cluster_command

        return cluster_command(args, config)
    if args.command in ("restore", "metadata"):
        from tierfs.cli.commands.metadata import run_metadata_command

        return run_metadata_command(args, config)
    return trio.run(_run_store_command, args, config)


def _store_path_hint(args: argparse.Namespace) -> str:
    """A name not found that is a local path (``/mnt/tierfs/logs/x``, ``~/...``): names
    are store paths; under a tierfs mount, which one it is."""
    given = [p for p in ([getattr(args, "path", None)] + list(getattr(args, "paths", None) or [])) if p]
    local_paths = [Path(str(path)).expanduser() for path in given if str(path).startswith(("/", "~"))]
    if not local_paths:
        return ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        mounts = []
    for local in local_paths:
        for entry in mounts:
            source, mountpoint, kind = (entry.split() + ["", "", ""])[:3]
            point = Path(mountpoint.replace("\\040", " "))
            if kind == "fuse.tierfs" and local.is_relative_to(point) and local != point:
                return (f": names are store paths, not local ones; under the mount at {point} "
                        f"that is {str(local.relative_to(point))!r}")
        if local.exists():
            return ": names are store paths (logs/app.log), not local files"
    return ""


def _report(error: BaseException, args: argparse.Namespace) -> int:
    failure = describe(error)
    if failure.code == "not_found":
        failure = dataclasses.replace(failure, message=failure.message + _store_path_hint(args))
    if args.verbose:
        traceback.print_exception(error, file=sys.stderr)
    if args.json:
        line = json.dumps({"error": {"code": failure.code, "message": failure.message,
                                     "exit_code": failure.exit_code}})
    else:
        line = failure.line
    print(line, file=sys.stderr, flush=True)
    return failure.exit_code


def execute(args: argparse.Namespace) -> int:
    """Run a parsed command; its exit code. Errors become one line on stderr here."""
    args.verbose = args.verbose or 0
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _dispatch(args)
    except BrokenPipeError:  # the reader went away (tierfs cat | head): nothing to say
        return EXIT_OK
    except BaseException as e:  # noqa: BLE001 - the one place every failure becomes one line
        if isinstance(e, SystemExit):
            raise
        return _report(e, args)
