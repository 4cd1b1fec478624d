"""``tierfs defrag PATH``: merge a segment's runs of small adjacent chunks.

Runs against the daemon or the in-process store alike (``SegmentStoreAPI.defrag``, the
``defrag`` operation). Prints one line saying what was merged, or the result as JSON
with ``--json``.

Invariant: the command only reports; errors become messages and exit codes in
``commands.execute``, like every other command's.
"""

from __future__ import annotations

import argparse
import json

from tierfs.contracts.api import SegmentStoreAPI

EXIT_OK = 0


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):.1f} MiB"


async def defrag_command(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    result = await store.defrag(args.path)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return EXIT_OK
    skipped = f", {result['runs_skipped']} skipped (changed meanwhile)" if result["runs_skipped"] else ""
    print(
        f"{result['path']}: {result['chunks_before']} -> {result['chunks_after']} chunks "
        f"({result['chunks_merged']} merged in {result['runs_merged']} runs{skipped}; "
        f"{_mib(result['copied_natively_bytes'])} copied inside tier-2, "
        f"{_mib(result['rewritten_bytes'])} read and rewritten)"
    )
    return EXIT_OK
