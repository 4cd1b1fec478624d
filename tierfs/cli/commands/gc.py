"""``tierfs gc [--dry-run]``, and the orphan lines of ``tierfs fsck``.

``gc`` asks the store (the daemon, or the engine in-process) to delete the chunk and
offload objects no metadata references that are older than the grace period
(``orphan_grace_s``); with ``--dry-run`` it only lists them. Objects of the owners
before a takeover from another data dir are only listed, unless ``--older-owners``. One line per object, then
a summary: how many and how many bytes, and how many unreferenced objects were kept
and why. Exit code 0, or 1 if a delete failed (its message on stderr; the next sweep
tries again).

Invariant: like every handler it sees only ``SegmentStoreAPI``, so the output is the
same with or without a daemon.
"""

from __future__ import annotations

import argparse
import sys

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.reports.gc import OrphanObject
from tierfs.contracts.units import format_duration

EXIT_OK, EXIT_FAILED = 0, 1  # as cli/commands.py


async def gc_command(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    report = await store.gc(dry_run=args.dry_run, older_owners=args.older_owners)
    verb = "would delete" if report.dry_run else "deleted"
    for orphan in report.orphans:
        print(f"{verb} {orphan}")
    for orphan in report.kept_older_owner:
        print(f"kept {orphan}, of owner epoch {orphan.epoch} (before this store took over from another "
              "data dir, which may reference it)")
    print(
        f"{verb} {len(report.orphans)} orphan objects, {report.orphan_bytes} bytes; kept "
        f"{report.kept_young} younger than the grace period ({format_duration(report.grace_s)}), "
        f"{report.kept_in_flight} being written, {report.kept_newer_epoch} of a newer owner epoch, "
        f"{len(report.kept_older_owner)} of an older owner's (--older-owners deletes them)"
    )
    for message in report.failed:
        print(f"tierfs: gc could not delete {message}", file=sys.stderr)
    return EXIT_FAILED if report.failed else EXIT_OK


def print_orphans(orphans: list[OrphanObject]) -> None:
    """fsck's lines for orphans: not damage, ``tierfs gc`` deletes them."""
    for orphan in orphans:
        print(f"ORPHAN {orphan}")
    if orphans:
        total_bytes = sum(o.size_bytes for o in orphans)
        print(f"{len(orphans)} orphan objects ({total_bytes} bytes) no metadata references: "
              "`tierfs gc` deletes those older than the grace period")
