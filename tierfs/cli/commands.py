"""What each ``tierfs`` subcommand does (``COMMANDS``), and running one (``execute``).

A command handler sees only ``SegmentStoreAPI``: it runs against ``RemoteStore`` when a
daemon serves the data dir and against an in-process ``SegmentStore`` otherwise, so
the output is the same either way. ``serve`` and ``mount``/``umount`` run the daemon
instead.

Invariants:
- Errors become messages and exit codes here only, in ``execute``; a handler returns
  its exit code.
- What a command does not need is not imported: the HTTP client only when a daemon's
  socket exists, the engine only to open the store in-process, the server only to
  serve (``tests/test_import_hygiene.py``).
- Output is streamed in bounded pieces (``cat``, ``tail``); appends too (``streaming``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from tierfs.cli.defrag_command import defrag_command
from tierfs.cli.gc_command import gc_command, print_orphans
from tierfs.cli.ownership_commands import EXIT_OWNED_ELSEWHERE, OWNERSHIP_COMMANDS
from tierfs.cli.streaming import append_command, follow_segment
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.config import StoreConfig, load_config
from tierfs.contracts.datadir import socket_path
from tierfs.contracts.errors import (
    DaemonUnavailableError,
    IsADirectoryError_,
    StoreInUseError,
    TierFSError,
)
from tierfs.contracts.info import DirectoryInfo, Info, SegmentInfo
from tierfs.contracts.policy import POLICY_KEYS, parse_assignments

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DAMAGED, EXIT_IN_USE, EXIT_NO_SPACE = 0, 1, 2, 3, 4, 6
# errors with an exit code of their own; every other TierFSError exits EXIT_FAILED
EXIT_CODES = {"owned_elsewhere": EXIT_OWNED_ELSEWHERE, "no_space": EXIT_NO_SPACE}
CAT_PIECE_BYTES = 4 << 20  # cat streams in pieces: bounded memory, read-ahead keeps up
TAIL_SCAN_BYTES = 64 << 10  # tail -n scans backwards for newlines in pieces of this size
OFFLOAD_POLL_S = 0.2  # offload progress is polled this often

Handler = Callable[[argparse.Namespace, SegmentStoreAPI], Awaitable[int]]


# ---------------------------------------------------------------- segments and data
async def _create(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    info = await store.create(args.path, durability=args.durability, make_parents=args.parents)
    print(info.name)
    return EXIT_OK


async def _cat(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    reader = store.open_reader(args.path)
    offset, remaining = args.offset, args.length
    if offset is None:  # from the first byte retention kept
        info = await store.stat(args.path)
        offset = info.start_offset if isinstance(info, SegmentInfo) else 0
    while remaining is None or remaining > 0:
        piece_bytes = CAT_PIECE_BYTES if remaining is None else min(remaining, CAT_PIECE_BYTES)
        data = await reader.read(offset, piece_bytes, unconfirmed=args.unconfirmed)
        if not data:
            break
        sys.stdout.buffer.write(data)
        offset += len(data)
        remaining = None if remaining is None else remaining - len(data)
    sys.stdout.buffer.flush()
    return EXIT_OK


async def _tail_start(store: SegmentStoreAPI, path: str, length: int, lines: int) -> int:
    """Offset of the first of the last ``lines`` lines (a final newline ends a line)."""
    position = length
    seen = 0
    while position > 0:
        start = max(0, position - TAIL_SCAN_BYTES)
        piece = await store.read(path, start, position - start)
        for index in range(len(piece) - 1, -1, -1):
            if piece[index] == 0x0A and start + index != length - 1:
                seen += 1
                if seen == lines:
                    return start + index + 1
        position = start
    return 0


async def _tail(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    info = await store.stat(args.path)
    if not isinstance(info, SegmentInfo):
        raise IsADirectoryError_(info.name)
    length = info.length
    if args.bytes is not None:
        offset = max(0, length - args.bytes)
    else:
        offset = await _tail_start(store, args.path, length, args.lines) if args.lines else length
    out = sys.stdout.buffer
    while offset < length:
        data = await store.read(args.path, offset, min(length - offset, CAT_PIECE_BYTES))
        out.write(data)
        offset += len(data)
    out.flush()
    if args.follow:
        await follow_segment(store, args.path, offset, out)
    return EXIT_OK


async def _sync(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    print(await store.sync(args.path))
    return EXIT_OK


async def _flush(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    await store.flush(args.path)
    return EXIT_OK


async def _concat(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    info = await store.concat(args.target, args.sources)
    print(info.length)
    return EXIT_OK


# ---------------------------------------------------------------- namespace
def _print_stat(info: Info, as_json: bool) -> None:
    if as_json:
        print(json.dumps(dataclasses.asdict(info), indent=2, sort_keys=True))
        return
    for key, value in dataclasses.asdict(info).items():
        print(f"{key:16} {value}")


# ``ls -l``: the letter after the sealed flag names the durability level
DURABILITY_FLAGS = {"pd": "p", "vd": "v", "tier2": "t"}


def _ls_line(info: Info, long: bool) -> str:
    base = info.name.rpartition("/")[2] or "/"
    if isinstance(info, DirectoryInfo):
        return f"d {'-':>12} {'':3} {'':2} {base}/" if long else base + "/"
    if not long:
        return base
    flags = ("s" if info.sealed else "-") + DURABILITY_FLAGS.get(info.durability, "?")
    return f"- {info.length:>12} {flags:3} {info.chunk_count:>2} {base}"


async def _stat(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    _print_stat(await store.stat(args.path), args.json)
    return EXIT_OK


async def _ls(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    entries = await store.list(args.path)
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2, sort_keys=True))
    else:
        for entry in entries:
            print(_ls_line(entry, args.long))
    return EXIT_OK


async def _mkdir(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    await store.mkdir(args.path, parents=args.parents, exist_ok=args.parents)
    return EXIT_OK


def _path_command(call: Callable[[SegmentStoreAPI, str], Awaitable[object]]) -> Handler:
    """A command that calls one store method with the path and prints nothing."""

    async def handler(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
        await call(store, args.path)
        return EXIT_OK

    return handler


async def _mv(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    await store.rename(args.source, args.target)
    return EXIT_OK


async def _fsck(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    report = await store.fsck()
    for problem in report.problems:
        print(f"DAMAGED {problem}")
    print_orphans(report.orphans)
    print(
        f"checked {report.segments} segments, {report.chunks} chunks, "
        f"{report.bytes_checked} bytes: "
        + ("OK" if not report.problems else f"{len(report.problems)} problems")
    )
    return EXIT_DAMAGED if report.problems else EXIT_OK


# ---------------------------------------------------------------- offload and policies
def _mib(value: int) -> str:
    return f"{value / (1 << 20):.1f} MiB"


def _status_line(status: dict[str, Any]) -> str:
    state = status["state"]
    line = f"{status['name']}: {state}"
    if state in ("RUNNING", "SUCCESS", "ERROR"):
        line += (f" ({status['trigger']}) {_mib(status['bytes_done'])} of {_mib(status['bytes_total'])}, "
                 f"{status['chunks_done']}/{status['chunks_total']} chunks")
    if state == "ERROR":
        line += f": {status['error']}"
    return line + (f"; offloaded {_mib(status['offloaded_bytes'])} of "
                   f"{_mib(status['sealed_bytes'])} sealed")


def _progress_bar(status: dict[str, Any], width: int = 30) -> str:
    total = status["bytes_total"] or 1
    done = min(status["bytes_done"], total)
    filled = width * done // total
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * done // total:3d}% "
            f"{_mib(status['bytes_done'])}/{_mib(status['bytes_total'])}")


async def _offload_wait(store: SegmentStoreAPI, path: str, bar: Any) -> dict[str, Any]:
    """Poll the status until the job is no longer RUNNING; draw ``bar`` meanwhile."""
    while True:
        status = await store.offload_status(path)
        if bar is not None:
            bar.write(_progress_bar(status))
            bar.flush()
        if status["state"] != "RUNNING":
            if bar is not None:
                bar.write("\n")
            return status
        await trio.sleep(OFFLOAD_POLL_S)


async def _offload(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    status = await store.offload(args.path, args.up_to)
    if args.no_wait:
        print(_status_line(status))
        return EXIT_OK
    status = await _offload_wait(store, args.path, None if args.quiet else sys.stderr)
    print(_status_line(status))
    return EXIT_FAILED if status["state"] == "ERROR" else EXIT_OK


async def _offload_status(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    if args.wait:
        status = await _offload_wait(store, args.path, None)
    else:
        status = await store.offload_status(args.path)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(_status_line(status))
    return EXIT_FAILED if status["state"] == "ERROR" else EXIT_OK


def _print_policy(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    for key in POLICY_KEYS:
        entry = result["effective"].get(key)
        if entry is None:
            print(f"{key:18} -")
        else:
            source = "set here" if key in result["set"] else f"from {entry['from'] or '/'}"
            print(f"{key:18} {entry['value']}  ({source})")


async def _policy(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    if args.action == "set":
        result = await store.set_policy(args.path, parse_assignments(args.settings))
    else:
        result = await store.get_policy(args.path)
    _print_policy(result, args.json)
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "create": _create, "append": append_command, "cat": _cat, "tail": _tail, "sync": _sync,
    "flush": _flush, "concat": _concat, "stat": _stat, "ls": _ls, "mkdir": _mkdir,
    "rmdir": _path_command(lambda store, path: store.rmdir(path)),
    "seal": _path_command(lambda store, path: store.seal(path)),
    "unseal": _path_command(lambda store, path: store.unseal(path)),
    "rm": _path_command(lambda store, path: store.delete(path)),
    "mv": _mv, "fsck": _fsck,
    "offload": _offload, "offload-status": _offload_status, "policy": _policy, "gc": gc_command,
    "defrag": defrag_command,
}


# ---------------------------------------------------------------- running a command
def _daemon_client(data_dir: Path) -> TierClient | None:
    """A client of the daemon serving ``data_dir``, or None. Without its socket file no
    daemon serves, and the HTTP client is not even imported."""
    if not socket_path(data_dir).exists():
        return None
    from tierfs.remote.client import connect_if_serving

    return connect_if_serving(data_dir)


async def _run_store_command(args: argparse.Namespace, config: StoreConfig) -> int:
    handler = COMMANDS[args.command]
    client = await trio.to_thread.run_sync(_daemon_client, config.data_dir)
    if client is not None:
        from tierfs.remote.remote_store import RemoteStore

        try:
            return await handler(args, RemoteStore(client))
        finally:
            client.close()
    if config.containers:  # a cluster's containers are opened by their owners only
        raise DaemonUnavailableError(
            f"no tierfs daemon serves {config.data_dir}: in cluster mode (containers = {config.containers}) "
            "commands go through a daemon (tierfs serve --listen HOST:PORT)")
    from tierfs.store.facade import open_store

    async with open_store(config) as store:
        return await handler(args, store)


def _mount_commands(args: argparse.Namespace, config: StoreConfig) -> int:
    """``mount`` / ``umount``: imported here, so the rest of the CLI works without FUSE."""
    from tierfs.fuse.mount import MountError, mount_command, unmount_command

    if args.command == "umount":
        return unmount_command(Path(args.mountpoint))
    try:
        return mount_command(config, Path(args.mountpoint), listen=args.listen,
                             foreground=args.foreground, direct_io=not args.page_cache,
                             attr_timeout_s=args.attr_timeout, allow_other=args.allow_other)
    except MountError as e:
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_FAILED


def _load_config(args: argparse.Namespace) -> StoreConfig:
    return load_config(
        {
            "data_dir": args.data_dir,
            "tier2_url": args.tier2,
            "tier2_endpoint_url": args.tier2_endpoint_url,
            "metadata_url": args.metadata,
            "offload_url": args.offload_to,
            "offload_endpoint_url": args.offload_endpoint_url,
            "offload_deletion_lag_s": args.deletion_lag,
            "durability": getattr(args, "durability", None) if args.command != "create" else None,
            "takeover": args.takeover or args.command == "takeover" or None,
        },
        config_file=args.config,
    )


def execute(args: argparse.Namespace) -> int:
    """Run a parsed command; its exit code. Errors become a message on stderr here."""
    if getattr(args, "segment_durability", None) is not None:
        args.durability = args.segment_durability
    elif args.command == "create":
        args.durability = None
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command in ("serve", "mount"):
        from tierfs.server.process_memory import limit_malloc_arenas

        limit_malloc_arenas()  # before any thread: the daemon's memory follows its budgets
    try:
        config = _load_config(args)
        if args.command == "serve":
            from tierfs.server.daemon import serve

            trio.run(partial(serve, config, listen=args.listen))
            return EXIT_OK
        if args.command in ("mount", "umount"):
            return _mount_commands(args, config)
        if args.command in OWNERSHIP_COMMANDS:
            return OWNERSHIP_COMMANDS[args.command](args, config)
        if args.command in ("restore", "metadata"):
            from tierfs.cli.metadata_commands import run_metadata_command

            return run_metadata_command(args, config)
        return trio.run(_run_store_command, args, config)
    except StoreInUseError as e:
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_IN_USE
    except TierFSError as e:  # the stable code too: the same as the HTTP API's
        print(f"tierfs: {e} ({e.code})", file=sys.stderr)
        return EXIT_CODES.get(e.code, EXIT_FAILED)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the data dir or a file named on the command line
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
