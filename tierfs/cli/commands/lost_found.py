"""``tierfs lost-found list [--json]`` and ``tierfs lost-found restore ENTRY [--to
SEGMENT] [--keep]``: what the data dir holds aside, and putting it back.

``list`` prints one line per entry of ``<data_dir>/lost+found`` (path, segment, offsets,
bytes, owner epoch, why), then the tier-2 objects kept because
an owner before a takeover from another data dir may reference them (``gc`` lists them
as ``kept_older_owner``). ``restore`` appends an entry's appends at the end of their
segment (or of ``--to``), each identified append with its writer identity, so one the
segment holds already is not appended twice (``store/lost_found_files``), then
removes the entry unless ``--keep``.

Invariant: it works on the data dir's own files and, for the store, through
``SegmentStoreAPI`` (the daemon serving the data dir, or the engine in-process); with
``--url`` (another host's daemon) it refuses, naming ``--data-dir``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.datadir import default_data_dir
from tierfs.contracts.errors import AlreadyAppendedError, InvalidArgumentError
from tierfs.contracts.reports.gc import orphans_json

if TYPE_CHECKING:
    from tierfs.store.datadir.lost_found_files import LostFoundEntry

EXIT_OK = 0


def _data_dir(args: argparse.Namespace) -> Path:
    if args.url:
        raise InvalidArgumentError("tierfs lost-found reads the data dir's own files: give --data-dir, not --url")
    return Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()


async def lost_found_command(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    from tierfs.store.datadir.lost_found_files import held

    data_dir = _data_dir(args)
    found = await trio.to_thread.run_sync(held, data_dir)
    if args.action == "list":
        older = (await store.gc(dry_run=True)).kept_older_owner
        if args.json:
            print(json.dumps({"entries": [{"path": e.path, "bytes": e.size, "segment": e.segment, "why": e.why,
                                           "description": e.description} for e in found],
                              "older_owner_objects": orphans_json(older)}, indent=2, sort_keys=True))
            return EXIT_OK
        for entry in found:
            print(entry.line())
        for orphan in older:
            print(f"tier-2 object {orphan.name} ({orphan.size_bytes} bytes) of owner epoch {orphan.epoch}: kept, an "
                  "owner before a takeover from another data dir may reference it (tierfs gc --older-owners "
                  "deletes it)")
        if not found and not older:
            print("lost+found is empty")
        return EXIT_OK
    return await _restore(args, store, data_dir, found)


async def _restore(args: argparse.Namespace, store: SegmentStoreAPI, data_dir: Path,
                   found: list[LostFoundEntry]) -> int:
    from tierfs.store.datadir.lost_found_files import restorable

    wanted = args.entry.rstrip("/")
    entry = next((e for e in found if e.path.rstrip("/") in (wanted, f"lost+found/{wanted}")), None)
    if entry is None:
        raise InvalidArgumentError(f"no lost+found entry {args.entry!r} in {data_dir} (tierfs lost-found list "
                                   "shows them)")
    appended = appended_bytes = held = 0
    segments: set[str] = set()
    stream = restorable(data_dir, entry)
    while (piece := await trio.to_thread.run_sync(next, stream, None)) is not None:  # one piece in memory
        target = args.to or piece.segment
        try:
            await store.append(target, piece.data, writer=piece.writer)
        except AlreadyAppendedError:
            held += 1  # the writer's later append is there, so this one landed before it
            continue
        appended += 1
        appended_bytes += len(piece.data)
        segments.add(target)
    print(f"appended {appended} records ({appended_bytes} bytes) of {entry.path} to "
          f"{', '.join(sorted(segments)) or 'no segment'}; identified appends the segment holds already were not "
          f"appended again{f' ({held} known older than their writer’s last)' if held else ''}")
    if not args.keep:
        path = data_dir / entry.path
        if path.is_dir():
            await trio.to_thread.run_sync(shutil.rmtree, path)
        else:
            path.unlink()
            path.with_name(path.name + ".json").unlink(missing_ok=True)
        print(f"removed {entry.path}")
    return EXIT_OK
