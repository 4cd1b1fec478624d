"""``tierfs takeover`` and ``tierfs owner``: who may write to tier-2 (engine/ownership/claims.py).

- ``takeover`` opens the store in-process with ``takeover`` set: it claims tier-2 with
  an epoch above every claim, so the previous owner, if it still runs, is fenced
  within one flush interval (engine/ownership/fencing.py); then it closes the store again
  (its journal replayed and flushed). ``--takeover`` on ``serve``, ``mount`` or any
  command does the same as part of that command.
- ``owner`` reads the claims on tier-2, the claim this data dir made last and its
  ``lost+found`` without opening the store (no lock, no claim): exit 0 when this data
  dir owns tier-2 (or nobody does yet), 5 when another owner holds it.

Invariant: these handlers get the config, not a store API: ``takeover`` must run
in-process (a daemon already owns its data dir), ``owner`` must not claim anything.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import trio

from tierfs.contracts.config import StoreConfig

EXIT_OK, EXIT_OWNED_ELSEWHERE = 0, 5  # cli/commands.py maps errors to the same codes


def _describe(claim: dict[str, Any]) -> str:
    return (f"epoch {claim['epoch']}, host {claim['host']} pid {claim['pid']} data dir "
            f"{claim['data_dir']}, claimed {claim['claimed_at']}")


def _takeover(args: argparse.Namespace, config: StoreConfig) -> int:
    from tierfs.store.datadir.ownership import ownership_report
    from tierfs.store.facade import open_store

    previous = ownership_report(config)["current_owner"]

    async def claim_it() -> tuple[int, str]:
        async with open_store(config.replace(takeover=True)) as store:
            return store.claim.epoch, store.chunk_storage.url

    epoch, url = trio.run(claim_it)
    print(f"tier-2 {url} belongs to {config.data_dir} as epoch {epoch}")
    if previous is not None:
        print(f"previous owner (fenced if it still runs): {_describe(previous)}")
    return EXIT_OK


def _owner(args: argparse.Namespace, config: StoreConfig) -> int:
    from tierfs.store.datadir.ownership import ownership_report

    report = ownership_report(config)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        current, mine = report["current_owner"], report["this_data_dir"]
        print(f"tier-2 {report['tier2']}")
        print("owner: " + (_describe(current) if current else "none yet"))
        print("this data dir: " + (f"last claimed epoch {mine['epoch']}" if mine else "never claimed it")
              + (" (owns tier-2)" if report["owns_tier2"] else
                 " (another owner holds tier-2: `tierfs takeover`)"))
        for line in report["lost_found_lines"]:
            print(f"lost+found: {line}")
        if report["lost_found_lines"]:
            print("(tierfs lost-found list shows them; tierfs lost-found restore ENTRY appends one again)")
    return EXIT_OK if report["owns_tier2"] else EXIT_OWNED_ELSEWHERE


OWNERSHIP_COMMANDS: dict[str, Callable[[argparse.Namespace, StoreConfig], int]] = {
    "takeover": _takeover, "owner": _owner,
}
