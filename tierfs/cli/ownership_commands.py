"""``tierfs takeover`` and ``tierfs owner``: who may write to tier-2 (engine/owner_claims.py).

- ``takeover`` opens the store in-process with ``takeover`` set: it claims tier-2 with
  an epoch above every claim, so the previous owner, if it still runs, is fenced
  within one flush interval (engine/fencing.py); then it closes the store again
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
import dataclasses
import json
from collections.abc import Callable

import trio

from tierfs.cli.commands import EXIT_OK, EXIT_OWNED_ELSEWHERE
from tierfs.contracts.config import StoreConfig


def _takeover(args: argparse.Namespace, config: StoreConfig) -> int:
    from tierfs.engine.chunkstore import open_chunk_storage
    from tierfs.engine.owner_claims import OwnerClaims
    from tierfs.store.facade import open_store

    previous = OwnerClaims(open_chunk_storage(config.chunk_store_url, config.chunk_store_options)).current()

    async def claim_it() -> tuple[int, str]:
        async with open_store(config.replace(takeover=True)) as store:
            return store.claim.epoch, store.chunk_storage.url

    epoch, url = trio.run(claim_it)
    print(f"tier-2 {url} belongs to {config.data_dir} as epoch {epoch}")
    if previous is not None:
        print(f"previous owner (fenced if it still runs): epoch {previous.epoch}, {previous.describe()}")
    return EXIT_OK


def _owner(args: argparse.Namespace, config: StoreConfig) -> int:
    from tierfs.engine.chunkstore import open_chunk_storage
    from tierfs.engine.lost_found import entries
    from tierfs.engine.owner_claims import OwnerClaims, read_local_claim

    storage = open_chunk_storage(config.chunk_store_url, config.chunk_store_options)
    current = OwnerClaims(storage).current()
    mine = read_local_claim(config.data_dir)
    owns = current is None or current.same_owner(mine)
    lost = entries(config.data_dir)
    if args.json:
        print(json.dumps({
            "tier2": storage.url, "owns_tier2": owns,
            "current_owner": dataclasses.asdict(current) if current else None,
            "this_data_dir": dataclasses.asdict(mine) if mine else None,
            "lost_found": [dataclasses.asdict(e) for e in lost],
        }, indent=1))
    else:
        print(f"tier-2 {storage.url}")
        print("owner: " + (f"epoch {current.epoch}, {current.describe()}" if current else "none yet"))
        print("this data dir: " + (f"last claimed epoch {mine.epoch}" if mine else "never claimed it")
              + (" (owns tier-2)" if owns else " (another owner holds tier-2: `tierfs takeover`)"))
        for entry in lost:
            facts = entry.description or {}
            print(f"lost+found: {entry.path} {entry.size} bytes of {facts.get('segment', '?')!r} "
                  f"at offset {facts.get('start_offset', '?')}")
    return EXIT_OK if owns else EXIT_OWNED_ELSEWHERE


OWNERSHIP_COMMANDS: dict[str, Callable[[argparse.Namespace, StoreConfig], int]] = {
    "takeover": _takeover, "owner": _owner,
}
