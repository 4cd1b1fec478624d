"""Who owns tier-2, seen from a data dir, without opening the store (``tierfs owner``).

Invariant: nothing here claims, writes or locks anything: the claims on tier-2, the
data dir's last claim and its ``lost+found`` are only read, so this works beside a
running daemon and on a data dir that is refused (``owned_elsewhere``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierfs.contracts.config import StoreConfig
from tierfs.engine.ownership.claims import OwnerClaims, read_local_claim
from tierfs.engine.recovery.lost_found import entries
from tierfs.engine.tier2.chunk_storage import open_chunk_storage


def ownership_report(config: StoreConfig) -> dict[str, Any]:
    """JSON-ready: ``tier2`` (URL), ``owns_tier2`` (this data dir's last claim is the
    newest, or there is none), ``current_owner`` and ``this_data_dir`` (claims or None),
    ``recovery.lost_found`` (path, size, description of each entry). Blocking."""
    storage = open_chunk_storage(config.chunk_store_url, config.chunk_store_options)
    current = OwnerClaims(storage).current()
    mine = read_local_claim(config.data_dir)
    return {
        "tier2": storage.url,
        "owns_tier2": current is None or current.same_owner(mine),
        "current_owner": dataclasses.asdict(current) if current else None,
        "this_data_dir": dataclasses.asdict(mine) if mine else None,
        "lost_found": [dataclasses.asdict(e) for e in entries(config.data_dir)],
        "lost_found_lines": [e.line() for e in entries(config.data_dir)],
    }
