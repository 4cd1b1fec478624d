"""Small pieces the metadata's SQL shares: the row type of a segment, the clock that
stamps records, and LIKE escaping.

Invariants:
- ``escape_like`` makes every character of a name literal in ``LIKE ? ESCAPE '\\'`` (the
  same on SQLite and PostgreSQL), so a prefix match never matches a name by accident.
"""

from __future__ import annotations

import dataclasses
import time

from tierfs.engine.record_types import SegmentMeta


@dataclasses.dataclass
class SegmentRow:
    segment_id: int
    name: str
    rev: int
    record: SegmentMeta


def now_ns() -> int:
    return time.time_ns()


def escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
