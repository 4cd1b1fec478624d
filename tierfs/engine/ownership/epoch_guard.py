"""Metadata commits conditional on the owner's epoch: a fenced owner commits nothing.

Several daemons can reach one metadata database (PostgreSQL): the owner of a store (or
of a segment container) and, after a takeover, the new owner, while the old one may
still run (a zombie: paused, partitioned, slow to notice). Names of chunk objects carry
the epoch, so the two never write one object; this guard makes sure the zombie cannot
commit either.

Invariants:
- Once ``guard_epoch(metadata, epoch)`` ran, every transaction of that connection first
  reads the store record's epoch, locking the row against change until it ends
  (``FOR SHARE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already excludes every
  other writer), and raises ``FencedError`` before any statement of its own if the
  epoch is no longer ``epoch``.
- A new owner raises the epoch in its own transaction (``MetadataStore.begin_epoch``):
  that update waits for the zombie's transaction in flight, and every later transaction
  of the zombie sees the new epoch and is refused. So each commit happens entirely
  before the takeover or not at all.
"""

from __future__ import annotations

from tierfs.contracts.errors import FencedError
from tierfs.engine import records
from tierfs.engine.metadata.database import POSTGRESQL
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.record_types import StoreMeta


def guard_epoch(metadata: MetadataStore, epoch: int) -> None:
    """Make every later transaction on ``metadata`` conditional on ``epoch``."""
    db = metadata.database
    lock = " FOR SHARE" if db.dialect == POSTGRESQL else ""
    statement = f"SELECT value FROM store WHERE key='store'{lock}"

    def check() -> None:
        row = db.execute(statement).fetchone()
        current = records.load(StoreMeta, bytes(row[0])).epoch if row is not None else 0
        if current != epoch:
            raise FencedError(epoch, current, "a newer owner of this metadata")

    db.epoch_guard = check
