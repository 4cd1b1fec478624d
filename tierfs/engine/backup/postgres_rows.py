"""Metadata export and import on PostgreSQL: ``RowSource`` and ``RowTarget``
(``backup.transfer``) on a psycopg connection whose ``search_path`` is the store's schema.

Invariants:
- The caller holds the transaction: an export reads inside one REPEATABLE READ,
  read-only transaction (one consistent state of every schema it reads: a cluster's
  containers together); an import is one transaction, rolled back on any error.
- The segment id sequence is never lowered: an import raises it to the highest id the
  export gave or holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tierfs.engine.backup.transfer import SqlRows


class PostgresRows(SqlRows):
    _mark = "%s"

    def rows(self, table: str, columns: Sequence[str], where: str) -> Iterable[Sequence[Any]]:
        cursor = self._db.cursor(name=f"export_{table}")  # server-side: memory does not grow with the table
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table}{where}")
        for row in cursor:
            yield tuple(bytes(value) if isinstance(value, memoryview) else value for value in row)
        cursor.close()

    def segment_sequence(self) -> int:
        sequence = self._db.execute("SELECT pg_get_serial_sequence('segments', 'id')").fetchone()[0]
        given = self._db.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}").fetchone()[0]
        held = self._db.execute("SELECT coalesce(max(id), 0) FROM segments").fetchone()[0]
        return max(int(given), int(held))

    def insert(self, table: str, columns: Sequence[str], values: Sequence[Any]) -> None:
        import psycopg

        if table == "store":  # the store's own records exist from its creation: replaced
            self._db.execute("DELETE FROM store WHERE key = %s", (values[0],))
        try:
            self._db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                             f"({', '.join(['%s'] * len(columns))})", values)
        except psycopg.errors.IntegrityError as e:
            raise ValueError(str(e).splitlines()[0]) from None

    def raise_sequence(self, sequence: int) -> None:
        highest = max(sequence, self.segment_sequence())
        if highest > 0:
            self._db.execute("SELECT setval(pg_get_serial_sequence('segments', 'id'), %s, true)", (highest,))
