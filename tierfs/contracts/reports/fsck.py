"""What ``fsck`` reports: value types shared by the engine's checker, the HTTP API, the
remote store and the CLI, and their wire form.

Orphans (objects no metadata references, ``contracts.gc_report``) are listed apart
from the problems: they are not damage, and ``tierfs gc`` deletes them.

Invariant: ``fsck_report_from_json(fsck_report_json(r)) == r``, so a report read from
the daemon is the report the in-process store gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierfs.contracts.reports.gc import OrphanObject, orphans_from_json, orphans_json


@dataclasses.dataclass(frozen=True)
class Problem:
    """One piece of damage: ``chunk`` is "" when the segment's metadata is at fault."""

    segment: str
    chunk: str
    message: str

    def __str__(self) -> str:
        where = f"{self.segment}" + (f" chunk {self.chunk}" if self.chunk else "")
        return f"{where}: {self.message}"


@dataclasses.dataclass(frozen=True)
class FsckReport:
    segments: int
    chunks: int
    bytes_checked: int
    problems: list[Problem]
    orphans: list[OrphanObject] = dataclasses.field(default_factory=list)


def fsck_report_json(report: FsckReport) -> dict[str, Any]:
    return {
        "segments": report.segments, "chunks": report.chunks,
        "bytes_checked": report.bytes_checked,
        "problems": [dataclasses.asdict(p) for p in report.problems],
        "orphans": orphans_json(report.orphans),
    }


def fsck_report_from_json(data: dict[str, Any]) -> FsckReport:
    return FsckReport(
        segments=int(data["segments"]), chunks=int(data["chunks"]),
        bytes_checked=int(data["bytes_checked"]),
        problems=[Problem(**p) for p in data["problems"]],
        orphans=orphans_from_json(data.get("orphans", [])),
    )
