"""What orphan garbage collection (``gc``) reports, and what ``fsck`` lists as orphans:
value types shared by the engine's sweeper, the HTTP API, the remote store and the CLI,
and their wire form.

An *orphan* is a chunk-shaped tier-2 object or an offload-attempt-shaped long-term
object that no metadata references (see ``tierfs/engine/upkeep/orphans.py`` for what is a
candidate and why deleting one is safe).

Invariant: ``gc_report_from_json(gc_report_json(r)) == r`` (and the same for a list
of ``OrphanObject``), so a report read from the daemon is the one the in-process store
gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

TIER2 = "tier-2"
LONG_TERM = "long-term"


@dataclasses.dataclass(frozen=True)
class OrphanObject:
    """One object no metadata references: ``store`` is ``TIER2`` or ``LONG_TERM``."""

    store: str
    name: str
    size_bytes: int
    age_s: float
    epoch: int = 0  # the owner epoch in its name

    def __str__(self) -> str:
        return f"{self.store} {self.name} ({self.size_bytes} bytes, {self.age_s:.0f} s old)"


@dataclasses.dataclass(frozen=True)
class GcReport:
    """One sweep: ``orphans`` were deleted (with ``dry_run``: would be). Unreferenced
    objects that were kept are counted by why: younger than ``grace_s``, being written
    right now, or named with an owner epoch newer than this store's; those of an older
    lineage's epochs (before a takeover from another data dir) are listed."""

    dry_run: bool
    grace_s: float
    orphans: list[OrphanObject]
    kept_young: int = 0
    kept_in_flight: int = 0
    kept_newer_epoch: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)  # one message per failed delete
    kept_older_owner: list[OrphanObject] = dataclasses.field(default_factory=list)

    @property
    def orphan_bytes(self) -> int:
        return sum(o.size_bytes for o in self.orphans)


def orphans_json(orphans: list[OrphanObject]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(o) for o in orphans]


def orphans_from_json(data: list[dict[str, Any]]) -> list[OrphanObject]:
    return [
        OrphanObject(str(o["store"]), str(o["name"]), int(o["size_bytes"]), float(o["age_s"]),
                     int(o.get("epoch", 0)))
        for o in data
    ]


def gc_report_json(report: GcReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run, "grace_s": report.grace_s,
        "orphans": orphans_json(report.orphans), "orphan_bytes": report.orphan_bytes,
        "kept_young": report.kept_young, "kept_in_flight": report.kept_in_flight,
        "kept_newer_epoch": report.kept_newer_epoch, "failed": list(report.failed),
        "kept_older_owner": orphans_json(report.kept_older_owner),
    }


def gc_report_from_json(data: dict[str, Any]) -> GcReport:
    return GcReport(
        dry_run=bool(data["dry_run"]), grace_s=float(data["grace_s"]),
        orphans=orphans_from_json(data["orphans"]),
        kept_young=int(data["kept_young"]), kept_in_flight=int(data["kept_in_flight"]),
        kept_newer_epoch=int(data["kept_newer_epoch"]), failed=[str(m) for m in data["failed"]],
        kept_older_owner=orphans_from_json(data.get("kept_older_owner", [])),
    )
