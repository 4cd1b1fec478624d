"""The ``tierfs`` command line.

Global options choose the store (``--data-dir``, ``--tier2``, ``--config``). ``serve``
runs the daemon; ``mount`` runs it with a FUSE mount, ``umount`` ends that. Every other subcommand talks to the daemon when one serves the data
dir and opens the engine in-process otherwise, with the same output either way. Errors
are translated to messages and exit codes in one place, ``run``.

Exit codes: 0 success; 1 the operation failed (message on stderr); 2 bad usage;
3 fsck found damage; 4 the data directory is in use by another process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from functools import partial
from typing import Any

import trio

from tierfs.contracts.config import DURABILITY_LEVELS, StoreConfig, load_config
from tierfs.contracts.errors import IsADirectoryError_, StoreInUseError, TierFSError
from tierfs.contracts.info import DirectoryInfo, SegmentInfo
from tierfs.contracts.policy import POLICY_KEYS, parse_assignments
from tierfs.remote.client import connect_if_serving
from tierfs.remote.remote_store import RemoteStore
from tierfs.server.daemon import serve
from tierfs.store.facade import open_store
from tierfs.store.fsck import Problem, fsck

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DAMAGED, EXIT_IN_USE = 0, 1, 2, 3, 4
STDIN_PIECE_BYTES = 16 << 20  # stdin is appended in pieces of this size
CAT_PIECE_BYTES = 4 << 20  # cat streams in pieces: bounded memory, read-ahead keeps up
TAIL_SCAN_BYTES = 64 << 10  # tail -n scans backwards for newlines in pieces of this size
TAIL_POLL_S = 30.0  # tail -f long-poll timeout; a new poll starts right after
OFFLOAD_POLL_S = 0.2  # offload progress is polled this often


def _info_dict(info: SegmentInfo | DirectoryInfo) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(info)


def _print_stat(info: SegmentInfo | DirectoryInfo, as_json: bool) -> None:
    if as_json:
        print(json.dumps(_info_dict(info), indent=2, sort_keys=True))
        return
    for key, value in _info_dict(info).items():
        print(f"{key:16} {value}")


def _ls_line(info: SegmentInfo | DirectoryInfo, long: bool) -> str:
    base = info.name.rpartition("/")[2] or "/"
    if isinstance(info, DirectoryInfo):
        return f"d {'-':>12} {'':3} {'':2} {base}/" if long else base + "/"
    if not long:
        return base
    flags = ("s" if info.sealed else "-") + ("v" if info.durability == "vd" else "p")
    return f"- {info.length:>12} {flags:3} {info.chunk_count:>2} {base}"


async def _cmd(args: argparse.Namespace, store: Any) -> int:
    command = args.command
    if command == "create":
        info = await store.create(args.path, durability=args.durability, make_parents=args.parents)
        print(info.name)
    elif command == "append":
        if args.file is not None:
            with open(args.file, "rb") as f:
                payload = f.read()
            print(await store.append(args.path, payload, expected_offset=args.expected_offset))
        elif args.data is None or args.data == "-":
            first = None
            expected = args.expected_offset
            while True:
                piece = sys.stdin.buffer.read(STDIN_PIECE_BYTES)
                if not piece and first is not None:
                    break
                offset = await store.append(args.path, piece, expected_offset=expected)
                first = offset if first is None else first
                expected = None
                if not piece:
                    break
            print(first)
        else:
            payload = args.data.encode()
            print(await store.append(args.path, payload, expected_offset=args.expected_offset))
    elif command == "cat":
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
    elif command == "stat":
        _print_stat(await store.stat(args.path), args.json)
    elif command == "ls":
        entries = await store.list(args.path)
        if args.json:
            print(json.dumps([_info_dict(e) for e in entries], indent=2, sort_keys=True))
        else:
            for entry in entries:
                print(_ls_line(entry, args.long))
    elif command == "mkdir":
        await store.mkdir(args.path, parents=args.parents, exist_ok=args.parents)
    elif command == "rmdir":
        await store.rmdir(args.path)
    elif command == "seal":
        await store.seal(args.path)
    elif command == "unseal":
        await store.unseal(args.path)
    elif command == "rm":
        await store.delete(args.path)
    elif command == "mv":
        await store.rename(args.source, args.target)
    elif command == "concat":
        info = await store.concat(args.target, args.sources)
        print(info.length)
    elif command == "sync":
        print(await store.sync(args.path))
    elif command == "flush":
        await store.flush(args.path)
    elif command == "fsck":
        report = await _fsck_report(store)
        for problem in report["problems"]:
            print(f"DAMAGED {Problem(**problem)}")
        print(
            f"checked {report['segments']} segments, {report['chunks']} chunks, "
            f"{report['bytes_checked']} bytes: "
            + ("OK" if not report["problems"] else f"{len(report['problems'])} problems")
        )
        return EXIT_DAMAGED if report["problems"] else EXIT_OK
    elif command == "tail":
        await _tail(args, store)
    elif command == "offload":
        return await _offload(args, store)
    elif command == "offload-status":
        status = await _offload_wait(store, args.path, None) if args.wait else await store.offload_status(args.path)
        if args.json:
            print(json.dumps(status, indent=2, sort_keys=True))
        else:
            print(_status_line(status))
        return EXIT_FAILED if status["state"] == "ERROR" else EXIT_OK
    elif command == "policy":
        if args.action == "set":
            if isinstance(store, RemoteStore):
                result = await store.set_policy_settings(args.path, args.settings)
            else:
                result = await store.set_policy(args.path, parse_assignments(args.settings))
        else:
            result = await store.get_policy(args.path) if isinstance(store, RemoteStore) else store.get_policy(args.path)
        _print_policy(result, args.json)
    else:  # pragma: no cover - argparse rejects unknown commands
        raise AssertionError(command)
    return EXIT_OK


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


async def _offload_wait(store: Any, path: str, bar: Any) -> dict[str, Any]:
    """Poll the status until the job is no longer RUNNING; draw ``bar`` meanwhile."""
    while True:
        status: dict[str, Any] = await store.offload_status(path)
        if bar is not None:
            bar.write(_progress_bar(status))
            bar.flush()
        if status["state"] != "RUNNING":
            if bar is not None:
                bar.write("\n")
            return status
        await trio.sleep(OFFLOAD_POLL_S)


async def _offload(args: argparse.Namespace, store: Any) -> int:
    status = await store.offload(args.path, args.up_to)
    if args.no_wait:
        print(_status_line(status))
        return EXIT_OK
    status = await _offload_wait(store, args.path, None if args.quiet else sys.stderr)
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


async def _fsck_report(store: Any) -> dict[str, Any]:
    if isinstance(store, RemoteStore):
        return await store.fsck_report()
    report = await fsck(store)
    return {
        "segments": report.segments, "chunks": report.chunks,
        "bytes_checked": report.bytes_checked,
        "problems": [dataclasses.asdict(p) for p in report.problems],
    }


async def _tail_start(store: Any, path: str, length: int, lines: int) -> int:
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


async def _tail(args: argparse.Namespace, store: Any) -> None:
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
    while args.follow:
        durable = await store.wait_for_data(args.path, offset, TAIL_POLL_S)
        while offset < durable:
            data = await store.read(args.path, offset, min(durable - offset, CAT_PIECE_BYTES))
            out.write(data)
            offset += len(data)
        out.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierfs", description="Tiered storage for append-only segments."
    )
    parser.add_argument("--data-dir", help="data directory (default ~/.local/share/tierfs)")
    parser.add_argument("--tier2", help="tier-2 chunk store URL (default <data-dir>/chunks)")
    parser.add_argument(
        "--tier2-endpoint-url", help="S3-compatible endpoint for an s3:// tier-2 (e.g. MinIO)"
    )
    parser.add_argument("--offload-to", metavar="URL",
                        help="long-term store for offloaded chunks (e.g. s3://bucket/prefix)")
    parser.add_argument("--offload-endpoint-url", help="S3-compatible endpoint for an s3:// --offload-to")
    parser.add_argument("--deletion-lag", type=float, metavar="SECONDS",
                        help="delete the chunk-store copy this long after an offload (default 14400)")
    parser.add_argument("--config", help="TOML config file (default $TIERFS_CONFIG)")
    parser.add_argument("--durability", choices=DURABILITY_LEVELS, help="default for new segments")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text)

    p = add("create", "create an empty segment")
    p.add_argument("path")
    p.add_argument("--durability", dest="segment_durability", choices=DURABILITY_LEVELS)
    p.add_argument("-p", "--parents", action="store_true", help="create missing parent directories")
    p = add("append", "append DATA, a file or stdin as one record; prints its offset")
    p.add_argument("path")
    p.add_argument("data", nargs="?", help="the bytes to append (UTF-8), or - for stdin")
    p.add_argument("--file", help="append the contents of this file")
    p.add_argument("--expected-offset", type=int, help="append only if the length is this")
    p = add("cat", "write a segment's bytes to stdout")
    p.add_argument("path")
    p.add_argument("--offset", type=int, help="default: the first byte retention kept")
    p.add_argument("--length", type=int)
    p.add_argument("--unconfirmed", action="store_true", help="read up to the appended length")
    p = add("stat", "show a segment's or directory's attributes")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p = add("ls", "list a directory")
    p.add_argument("path", nargs="?", default="")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("--json", action="store_true")
    p = add("mkdir", "create a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    for name, text in (("rmdir", "remove an empty directory"), ("seal", "make a segment read-only"),
                       ("unseal", "make a sealed segment appendable again"), ("rm", "delete a segment")):
        add(name, text).add_argument("path")
    p = add("mv", "rename a segment or directory (metadata only)")
    p.add_argument("source")
    p.add_argument("target")
    p = add("concat", "append sealed SOURCEs, in order, to TARGET and remove them "
                      "(metadata only, one transaction); prints the new length")
    p.add_argument("target")
    p.add_argument("sources", nargs="+", metavar="source")
    p = add("sync", "make every appended byte durable; prints the durable length")
    p.add_argument("path", nargs="?")
    p = add("flush", "wait until tier-2 holds every durable byte")
    p.add_argument("path", nargs="?")
    add("fsck", "verify every chunk's CRC32C and the metadata invariants")
    p = add("tail", "print the end of a segment; -f follows it as it grows")
    p.add_argument("path")
    p.add_argument("-f", "--follow", action="store_true")
    group = p.add_mutually_exclusive_group()
    group.add_argument("-n", "--lines", type=int, default=10, help="last LINES lines (default 10)")
    group.add_argument("-c", "--bytes", type=int, help="last BYTES bytes")
    p = add("offload", "offload a segment's sealed chunks to the long-term store (progress on stderr)")
    p.add_argument("path")
    p.add_argument("--up-to", type=int, metavar="OFFSET", help="only chunks that end at or before OFFSET")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p = add("offload-status", "NOT_RUN / RUNNING / SUCCESS / ERROR of a segment's offload")
    p.add_argument("path")
    p.add_argument("--wait", action="store_true", help="wait until it is no longer RUNNING")
    p.add_argument("--json", action="store_true")
    p = add("policy", "set or show offload and retention policies of a directory")
    policy_sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = policy_sub.add_parser("set", help="set KEY=VALUE (VALUE none unsets); keys: " + ", ".join(POLICY_KEYS))
    q.add_argument("path", help="a directory ('' or / for the root)")
    q.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    q.add_argument("--json", action="store_true")
    q = policy_sub.add_parser("get", help="the policy in effect, and where each value comes from")
    q.add_argument("path")
    q.add_argument("--json", action="store_true")
    p = add("serve", "run the daemon: HTTP API on <data-dir>/tierfs.sock until SIGTERM")
    p.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (bearer token required)")
    p = add("mount", "run the daemon with the store mounted at MOUNTPOINT (FUSE); the API keeps serving")
    p.add_argument("mountpoint")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (logs to stderr)")
    p.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (bearer token required)")
    p.add_argument("--page-cache", action="store_true",
                   help="read and write through the kernel page cache instead of direct I/O "
                        "(needed for mmap; slower, see docs/PERFORMANCE.md)")
    p.add_argument("--attr-timeout", type=float, default=1.0, metavar="SECONDS",
                   help="how long the kernel may cache attributes (default 1; growth is "
                        "notified at once anyway)")
    p = add("umount", "unmount a tierfs mount; its daemon flushes, closes and exits")
    p.add_argument("mountpoint")
    return parser


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "segment_durability", None) is not None:
        args.durability = args.segment_durability
    elif args.command == "create":
        args.durability = None
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(
            {
                "data_dir": args.data_dir,
                "tier2_url": args.tier2,
                "tier2_endpoint_url": args.tier2_endpoint_url,
                "offload_url": args.offload_to,
                "offload_endpoint_url": args.offload_endpoint_url,
                "offload_deletion_lag_s": args.deletion_lag,
                "durability": getattr(args, "durability", None) if args.command != "create" else None,
            },
            config_file=args.config,
        )

        if args.command == "serve":
            trio.run(partial(serve, config, listen=args.listen))
            return EXIT_OK
        if args.command in ("mount", "umount"):
            return _mount_commands(args, config)

        async def main() -> int:
            client = await trio.to_thread.run_sync(connect_if_serving, config.data_dir)
            if client is not None:
                try:
                    return await _cmd(args, RemoteStore(client))
                finally:
                    client.close()
            async with open_store(config) as store:
                return await _cmd(args, store)

        return trio.run(main)
    except StoreInUseError as e:
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_IN_USE
    except TierFSError as e:
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the data dir or a file named on the command line
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _mount_commands(args: argparse.Namespace, config: StoreConfig) -> int:
    """``mount`` / ``umount``: imported here, so the rest of the CLI works without FUSE."""
    from pathlib import Path

    from tierfs.fuse.mount import MountError, mount_command, unmount_command

    if args.command == "umount":
        return unmount_command(Path(args.mountpoint))
    try:
        return mount_command(config, Path(args.mountpoint), listen=args.listen,
                             foreground=args.foreground, direct_io=not args.page_cache,
                             attr_timeout_s=args.attr_timeout)
    except MountError as e:
        print(f"tierfs: {e}", file=sys.stderr)
        return EXIT_FAILED


def main() -> None:
    sys.exit(run())




if __name__ == "__main__":
    main()
