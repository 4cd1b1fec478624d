"""What each store subcommand of ``tierfs`` does (``COMMANDS``); ``execution`` runs one.

A command handler sees only ``SegmentStoreAPI``: it runs against ``RemoteStore`` when a
daemon serves the data dir and against an in-process ``SegmentStore`` otherwise, so
the output is the same either way. ``serve`` and ``mount``/``umount`` run the daemon
instead (``daemon_commands``).

Invariants:
- A handler returns its exit code and raises its errors: ``execution`` turns them into
  one line and an exit code, in one place.
- ``--json`` prints JSON (sizes in bytes); without it sizes a person set (policies)
  are shown in units (``1GiB``, ``4h``), as they are typed.
- Output is streamed in bounded pieces (``cat``; ``tail`` in ``tail``); appends too (``streaming``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from tierfs.cli.commands.defrag import defrag_command
from tierfs.cli.commands.gc import gc_command, print_orphans
from tierfs.cli.commands.lost_found import lost_found_command
from tierfs.cli.failures import EXIT_DAMAGED, EXIT_FAILED, EXIT_OK
from tierfs.cli.quoting import quoted
from tierfs.cli.streaming import append_command
from tierfs.cli.tail.command import tail_command
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.contracts.policy import POLICY_KEYS, format_policy_value, parse_assignments
from tierfs.contracts.reports.fsck import fsck_report_json
from tierfs.contracts.reports.info import DirectoryInfo, Info, SegmentInfo
from tierfs.contracts.size_text import human_size, readable_size

CAT_PIECE_BYTES = 4 << 20  # cat streams in pieces: bounded memory, read-ahead keeps up
OFFLOAD_POLL_S = 0.2  # offload progress is polled this often

Handler = Callable[[argparse.Namespace, SegmentStoreAPI], Awaitable[int]]


# ---------------------------------------------------------------- segments and data
def _parents_hint(error: SegmentNotFoundError, path: str, command: str) -> SegmentNotFoundError:
    """A missing parent directory: the message says that ``-p`` makes it."""
    if path.strip("/").startswith(f"{error.name}/"):
        error.args = (f"{error.args[0]}: the parent directory does not exist (tierfs {command} -p makes it)",)
    return error


async def _create(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    try:
        info = await store.create(args.path, durability=args.durability, make_parents=args.parents)
    except SegmentNotFoundError as e:
        raise _parents_hint(e, args.path, "create") from None
    print(json.dumps(dataclasses.asdict(info), sort_keys=True) if args.json else info.name)
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


async def _sync(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    durable_length = await store.sync(args.path)
    print(json.dumps({"durable_length": durable_length}) if args.json else durable_length)
    return EXIT_OK


async def _flush(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    await store.flush(args.path)
    return EXIT_OK


async def _concat(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    info = await store.concat(args.target, args.sources)
    print(json.dumps(dataclasses.asdict(info), sort_keys=True) if args.json else info.length)
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


def _ls_line(info: Info, long: bool, terminal: bool = False, human: bool = False) -> str:
    base = quoted(info.name.rpartition("/")[2], terminal) or "/"
    if isinstance(info, DirectoryInfo):
        return f"d {'-':>12} {'':3} {'':2} {base}/" if long else base + "/"
    if not long:
        return base
    flags = ("s" if info.sealed else "-") + DURABILITY_FLAGS.get(info.durability, "?")
    length = human_size(info.length) if human else str(info.length)
    return f"- {length:>12} {flags:3} {info.chunk_count:>2} {base}"


async def _stat(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    _print_stat(await store.stat(args.path), args.json)
    return EXIT_OK


async def _ls(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    entries = await store.list(args.path)
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2, sort_keys=True))
    else:
        terminal = sys.stdout.isatty()
        for entry in entries:
            print(_ls_line(entry, args.long, terminal, args.human))
    return EXIT_OK


async def _mkdir(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    try:
        await store.mkdir(args.path, parents=args.parents, exist_ok=args.parents)
    except SegmentNotFoundError as e:
        raise _parents_hint(e, args.path, "mkdir") from None
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
    if args.json:
        print(json.dumps(fsck_report_json(report), indent=2, sort_keys=True))
        return EXIT_DAMAGED if report.problems else EXIT_OK
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
def _status_line(status: dict[str, Any]) -> str:
    state = status["state"]
    line = f"{status['name']}: {state}"
    if state in ("RUNNING", "SUCCESS", "ERROR"):
        line += (f" ({status['trigger']}) {readable_size(status['bytes_done'])} of "
                 f"{readable_size(status['bytes_total'])}, "
                 f"{status['chunks_done']}/{status['chunks_total']} chunks")
    if state == "ERROR":
        line += f": {status['error']}"
    return line + (f"; offloaded {readable_size(status['offloaded_bytes'])} of "
                   f"{readable_size(status['sealed_bytes'])} sealed")


def _progress_bar(status: dict[str, Any], width: int = 30) -> str:
    total = status["bytes_total"] or 1
    done = min(status["bytes_done"], total)
    filled = width * done // total
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * done // total:3d}% "
            f"{readable_size(status['bytes_done'])}/{readable_size(status['bytes_total'])}")


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
            print(f"{key:18} {format_policy_value(key, entry['value'])}  ({source})")


async def _policy(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    if args.action == "set":
        result = await store.set_policy(args.path, parse_assignments(args.settings))
    else:
        result = await store.get_policy(args.path)
    _print_policy(result, args.json)
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "create": _create, "append": append_command, "cat": _cat, "tail": tail_command, "sync": _sync,
    "flush": _flush, "concat": _concat, "stat": _stat, "ls": _ls, "mkdir": _mkdir,
    "rmdir": _path_command(lambda store, path: store.rmdir(path)),
    "seal": _path_command(lambda store, path: store.seal(path)),
    "unseal": _path_command(lambda store, path: store.unseal(path)),
    "rm": _path_command(lambda store, path: store.delete(path)),
    "mv": _mv, "fsck": _fsck,
    "offload": _offload, "offload-status": _offload_status, "policy": _policy, "gc": gc_command,
    "defrag": defrag_command, "lost-found": lost_found_command,
}
