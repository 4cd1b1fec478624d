"""``tierfs restore`` and ``tierfs metadata export|import``: the data dir's metadata,
handled without opening the store as a service.

``restore`` rebuilds a data dir from the metadata backups on tier-2 (``store.restore``);
``metadata export`` writes the metadata as a versioned stream (docs/METADATA_FORMAT.md),
``metadata import`` loads one into an empty store (``store.metadata_files``).

Invariants:
- Errors are not handled here: they reach ``commands.execute``, which turns them into
  messages and exit codes in one place.
- ``import`` and ``restore`` take the data-dir lock, so they never run under a daemon;
  ``export`` reads one consistent state and may run while a daemon serves.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO

import trio

from tierfs.contracts.config import StoreConfig

EXIT_OK, EXIT_DAMAGED = 0, 3  # as in commands.py


def run_metadata_command(args: argparse.Namespace, config: StoreConfig) -> int:
    if args.command == "restore":
        return _restore(config)
    if args.action == "export":
        return _export(config, args.file)
    return _import(config, args.file)


def _restore(config: StoreConfig) -> int:
    from tierfs.store.datadir.restore import restore_store

    report = trio.run(restore_store, config)
    manifest = report.manifest
    print(f"restored {report.segments} segments into {config.data_dir} from backup "
          f"{manifest.stem} of {config.tier2_url} and {report.changes_applied} change batches after it")
    if report.appends_replayed:
        print(f"replayed {report.appends_replayed} appends ({report.bytes_replayed} bytes) from the data dir's "
              "journal")
    if report.changes_missing is not None:
        print(f"NOT RESTORED: {report.changes_missing}; the metadata is as of the last change before it")
    for name in report.set_aside:
        print(f"kept the old {name.split('.before-restore-')[0]} as {config.data_dir / name}")
    print(f"this data dir now owns {config.tier2_url} as epoch {report.epoch}; "
          f"always open it with --tier2 {config.tier2_url}")
    fsck = report.fsck
    for problem in fsck.problems:
        print(f"DAMAGED {problem}")
    print(f"fsck: checked {fsck.segments} segments, {fsck.chunks} chunks, {fsck.bytes_checked} bytes: "
          + ("OK" if not fsck.problems else f"{len(fsck.problems)} problems"))
    return EXIT_DAMAGED if fsck.problems or report.changes_missing is not None else EXIT_OK


def _export(config: StoreConfig, file: str) -> int:
    if config.containers:
        from tierfs.cluster.metadata_transfer import export_cluster_metadata

        def export(out: IO[bytes]) -> int:
            return export_cluster_metadata(config.metadata_url, out)
    else:
        from tierfs.store.datadir.metadata_files import export_store_metadata

        def export(out: IO[bytes]) -> int:
            return export_store_metadata(config, out)

    if file == "-":
        rows = export(sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        with open(file, "wb") as out:
            rows = export(out)
    print(f"exported {rows} rows", file=sys.stderr)
    return EXIT_OK


def _import(config: StoreConfig, file: str) -> int:
    if config.containers:
        from tierfs.cluster.metadata_transfer import import_cluster_metadata

        def load(source: IO[bytes]) -> int:
            return import_cluster_metadata(config.metadata_url, source, config.containers, config.lease_s)
        where = f"the cluster in {config.metadata_description}"
    else:
        from tierfs.store.datadir.metadata_files import import_store_metadata

        def load(source: IO[bytes]) -> int:
            return import_store_metadata(config, source)
        where = str(config.data_dir)

    if file == "-":
        rows = load(sys.stdin.buffer)
    else:
        with open(file, "rb") as source:
            rows = load(source)
    print(f"imported {rows} rows into {where}", file=sys.stderr)
    return EXIT_OK
