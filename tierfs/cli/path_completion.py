"""``tierfs __complete-path [GLOBAL OPTIONS] [--] PREFIX``: the store paths that start
with PREFIX, one per line (a directory ends in ``/``), for the shell completion
scripts (``completion``). Not a user command: it is left out of ``--help``.

Invariants:
- It never creates, waits or prints an error: a data dir that does not exist yet, one
  another command holds, a daemon that does not answer, or any failure completes
  nothing (exit 0, no output). The shell calls it under ``timeout``.
- It lists one directory (PREFIX's), through the daemon serving the data dir when one
  answers, else the engine in-process, as every store command does.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING

import trio

from tierfs.cli.execution import client_at, config_from_args, daemon_client, named_daemon_url
from tierfs.cli.global_options import add_global_options
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.datadir import LOCK_NAME, running_owner_pid
from tierfs.contracts.reports.info import DirectoryInfo

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

COMMAND = "__complete-path"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"tierfs {COMMAND}", add_help=False)
    add_global_options(parser, in_subcommand=False)
    parser.add_argument("prefix", nargs="?", default="")
    return parser


def _candidates(prefix: str, store_entries: list[tuple[str, bool]]) -> list[str]:
    """(full name, is a directory) entries of PREFIX's directory -> what completes it."""
    found = []
    for name, is_directory in store_entries:
        shown = name + "/" if is_directory else name
        if shown.startswith(prefix) and "\n" not in shown:
            found.append(shown)
    return sorted(found)


async def _entries(store: SegmentStoreAPI, directory: str) -> list[tuple[str, bool]]:
    return [(info.name, isinstance(info, DirectoryInfo)) for info in await store.list(directory)]


async def _list(args: argparse.Namespace, directory: str) -> list[tuple[str, bool]]:
    from tierfs.remote.remote_store import RemoteStore

    url = named_daemon_url(args)
    client: TierClient | None
    if url is not None:
        client = await trio.to_thread.run_sync(client_at, url)
    else:
        config = config_from_args(args)
        if not (config.data_dir / LOCK_NAME).exists():
            return []  # no store here yet: completing must not create one
        client = await trio.to_thread.run_sync(daemon_client, config.data_dir)
        if client is None:
            if running_owner_pid(config.data_dir) is not None or config.containers:
                return []  # held by a command that is not a daemon: never wait for it
            from tierfs.store.facade import open_store

            async with open_store(config) as store:
                return await _entries(store, directory)
    try:
        return await _entries(RemoteStore(client), directory)
    finally:
        client.close()


def complete_path(argv: list[str]) -> int:
    with contextlib.suppress(Exception, SystemExit):
        args = _parser().parse_args(argv)
        args.command, args.repair = COMMAND, False
        prefix = args.prefix.lstrip("/")
        typed_root = args.prefix[:len(args.prefix) - len(prefix)]  # "/x" completes as typed
        directory = prefix.rpartition("/")[0]
        for line in _candidates(prefix, trio.run(_list, args, directory)):
            print(typed_root + line)
    return 0
