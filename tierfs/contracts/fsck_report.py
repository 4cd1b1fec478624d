"""What ``fsck`` reports: value types shared by the engine's checker, the HTTP API, the
remote store and the CLI, and their wire form.

Invariant: ``fsck_report_from_json(fsck_report_json(r)) == r``, so a report read from
the daemon is the report the in-process store gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any


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


def fsck_report_json(report: FsckReport) -> dict[str, Any]:
    return {
        "segments": report.segments, "chunks": report.chunks,
        "bytes_checked": report.bytes_checked,
        "problems": [dataclasses.asdict(p) for p in report.problems],
    }


def fsck_report_from_json(data: dict[str, Any]) -> FsckReport:
    return FsckReport(
        segments=int(data["segments"]), chunks=int(data["chunks"]),
        bytes_checked=int(data["bytes_checked"]),
        problems=[Problem(**p) for p in data["problems"]],
    )
