"""Reading segment rows on demand: what the segment table asks the metadata for when a
segment it does not hold in memory is named, listed or walked.

Invariants:
- Read-only: never changes a row, never opens a transaction.
- Each call costs what it returns: one index lookup by name or id, one index range for
  a directory's entries (``segments.parent``, schema migration 2), one batch of a walk
  in name order, so nothing grows with the store but the walks that visit all of it.
- On SQLite it runs on a connection of its own (``SqliteDatabase``, autocommit), so it
  sees committed transactions only, never one the metadata's writer has in flight.
"""

from __future__ import annotations

from collections.abc import Iterator

from tierfs.contracts import names
from tierfs.engine import records
from tierfs.engine.metadata.database import Database
from tierfs.engine.record_types import Chunk, SegmentMeta, SegmentRow

_COLUMNS = "id, name, rev, value"
WALK_BATCH_ROWS = 1000  # rows per query of a walk: one round trip per thousand segments


def _row(values: tuple[int, str, int, bytes]) -> SegmentRow:
    segment_id, name, rev, value = values
    return SegmentRow(segment_id, name, rev, records.load(SegmentMeta, bytes(value)))


class SegmentRowReader:
    def __init__(self, db: Database) -> None:
        self._db = db

    def by_name(self, name: str) -> SegmentRow | None:
        found = self._db.execute(f"SELECT {_COLUMNS} FROM segments WHERE name=?", (name,)).fetchone()
        return None if found is None else _row(found)

    def by_id(self, segment_id: int) -> SegmentRow | None:
        found = self._db.execute(f"SELECT {_COLUMNS} FROM segments WHERE id=?", (segment_id,)).fetchone()
        return None if found is None else _row(found)

    def in_directory(self, directory: str) -> list[SegmentRow]:
        """The segments directly in ``directory`` ('' is the root), by name."""
        return [_row(values) for values in self._db.execute(
            f"SELECT {_COLUMNS} FROM segments WHERE parent=? ORDER BY name", (directory,))]

    def any_in_directory(self, directory: str) -> bool:
        return self._db.execute(
            "SELECT 1 FROM segments WHERE parent=? LIMIT 1", (directory,)).fetchone() is not None

    def walk(self, under: str = "") -> Iterator[list[SegmentRow]]:
        """Every segment (below directory ``under``, '' for all), in name order, in
        batches; each batch is one query that starts after the last name seen."""
        low = f"{under}/" if under else ""
        high = f"{under}0" if under else None  # '0' follows '/': the end of the prefix
        while True:
            if high is None:
                found = self._db.execute(
                    f"SELECT {_COLUMNS} FROM segments WHERE name > ? ORDER BY name LIMIT ?",
                    (low, WALK_BATCH_ROWS)).fetchall()
            else:
                found = self._db.execute(
                    f"SELECT {_COLUMNS} FROM segments WHERE name > ? AND name < ? ORDER BY name LIMIT ?",
                    (low, high, WALK_BATCH_ROWS)).fetchall()
            if not found:
                return
            yield [_row(values) for values in found]
            low = found[-1][1]

    def chunks_covering(self, segment_id: int, start: int, end: int) -> list[Chunk]:
        """The chunk records of a segment that overlap bytes ``[start, end)``, by offset:
        two index ranges on (segment_id, start_offset), whatever the segment holds."""
        found = self._db.execute(
            "SELECT value FROM chunks WHERE segment_id=? AND start_offset < ? AND start_offset >= "
            "(SELECT coalesce(max(start_offset), 0) FROM chunks WHERE segment_id=? AND start_offset <= ?) "
            "ORDER BY start_offset", (segment_id, end, segment_id, start))
        return [records.load(Chunk, bytes(value)) for (value,) in found]

    def detached(self) -> list[int]:
        """Ids of the segments detached while held (``names.detached_name``): one range
        of the name index."""
        low = names.DETACHED_DIRECTORY + "/"
        found = self._db.execute("SELECT id FROM segments WHERE name >= ? AND name < ?",
                                 (low, names.DETACHED_DIRECTORY + "0"))
        return [segment_id for (segment_id,) in found]

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM segments").fetchone()[0])

    def close(self) -> None:
        self._db.close()
