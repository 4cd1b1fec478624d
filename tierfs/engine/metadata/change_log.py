"""The metadata's change log: what changed since the last one shipped to tier-2, so a
restore brings back the metadata of a moment ago, not of the last whole snapshot.

Pravega keeps its segments' metadata in tier-2 for this reason: the host's disk may go
at any moment, with it a SQLite file that only a periodic snapshot protects. Here,
SQLite triggers (``metadata.migrations``, migration 3) add one row to ``change_log`` for
every row of ``store``, ``directories``, ``segments``, ``chunks`` and ``garbage`` that a
transaction inserts, updates or deletes: its table and key, in the same transaction.
``read_changes`` takes every logged key after a sequence number and the *current* row
of each (or none: deleted), all in one read transaction; ``encode`` makes it one object
(JSON lines and a trailer with the CRC32C), which ``backup.metadata_backup`` uploads, after
which the store prunes the log (``MetadataStore.prune_change_log``). A restore applies
the objects that follow its snapshot, in order (``apply_changes``).

Invariants:
- A batch is the state at one instant of every row that changed since the previous
  batch, so applying the batches in order over a snapshot gives the state at the last
  batch: rows not in a batch did not change meanwhile.
- Sequence numbers only grow (``AUTOINCREMENT``); a restore sets the counter to the
  highest it applied, so a restored store never reuses one.
- Only SQLite has the log: PostgreSQL keeps its own backups and every daemon sees it.
- A batch that fails its CRC32C or does not end with its trailer is not applied.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from tierfs.blocks.checksums import crc32c

CHANGE_LOG = "change_log"
FORMAT = "tierfs-metadata-changes"
VERSION = 1

# table -> (key columns, every stored column): the columns a restore writes back
LOGGED_TABLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "store": (("key",), ("key", "value")),
    "directories": (("name",), ("name", "value")),
    "segments": (("id",), ("id", "name", "rev", "value")),
    "chunks": (("segment_id", "start_offset"), ("segment_id", "start_offset", "value")),
    "garbage": (("name",), ("name", "queued_ns")),
}
KEY_SEPARATOR = "\x1f"  # between the parts of a composite key (never in a name: control characters are refused)


def _key_expression(prefix: str, keys: Sequence[str]) -> str:
    return f" || '{KEY_SEPARATOR}' || ".join(f"{prefix}.{column}" for column in keys)


def change_log_ddl() -> tuple[str, ...]:
    """The log table and its triggers (SQLite)."""
    statements = [f"CREATE TABLE IF NOT EXISTS {CHANGE_LOG} (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                  "tbl TEXT NOT NULL, key TEXT NOT NULL)"]
    for table, (keys, _) in LOGGED_TABLES.items():
        new, old = _key_expression("NEW", keys), _key_expression("OLD", keys)
        for event, inserts in (
            ("INSERT", f"INSERT INTO {CHANGE_LOG} (tbl, key) VALUES ('{table}', {new});"),
            ("DELETE", f"INSERT INTO {CHANGE_LOG} (tbl, key) VALUES ('{table}', {old});"),
            # the old key too only if the update changed it (a row moved to another key)
            ("UPDATE", f"INSERT INTO {CHANGE_LOG} (tbl, key) VALUES ('{table}', {new}); "
                       f"INSERT INTO {CHANGE_LOG} (tbl, key) SELECT '{table}', {old} WHERE {old} <> {new};"),
        ):
            statements.append(f"CREATE TRIGGER IF NOT EXISTS {CHANGE_LOG}_{table}_{event.lower()} "
                              f"AFTER {event} ON {table} BEGIN {inserts} END")
    return tuple(statements)


@dataclasses.dataclass(frozen=True)
class ChangeBatch:
    """Changes ``first_seq``..``last_seq``: (table, key parts, row or None) each."""

    first_seq: int
    last_seq: int
    rows: list[tuple[str, list[Any], list[Any] | None]]


def last_logged_seq(db: sqlite3.Connection) -> int:
    row = db.execute(f"SELECT seq FROM sqlite_sequence WHERE name = '{CHANGE_LOG}'").fetchone()
    return int(row[0]) if row is not None else 0


def read_changes(db: sqlite3.Connection, after_seq: int, max_rows: int) -> ChangeBatch | None:
    """The (at most ``max_rows``) changes logged after ``after_seq``, each with its row as
    it is now, in one read transaction of ``db`` (a connection of its own); None when
    there is none."""
    db.execute("BEGIN")
    try:
        logged = db.execute(f"SELECT seq, tbl, key FROM {CHANGE_LOG} WHERE seq > ? ORDER BY seq LIMIT ?",
                            (after_seq, max_rows)).fetchall()
        if not logged:
            return None
        latest: dict[tuple[str, str], None] = {}
        for _, table, key in logged:
            latest.pop((table, key), None)
            latest[(table, key)] = None  # in the order of each key's last change
        rows: list[tuple[str, list[Any], list[Any] | None]] = []
        for table, key in latest:
            keys, columns = LOGGED_TABLES[table]
            parts: list[Any] = key.split(KEY_SEPARATOR)
            if table in ("segments", "chunks"):
                parts = [int(p) for p in parts]
            where = " AND ".join(f"{column} = ?" for column in keys)
            found = db.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE {where}", parts).fetchone()
            rows.append((table, parts, None if found is None else list(found)))
        return ChangeBatch(int(logged[0][0]), int(logged[-1][0]), rows)
    finally:
        db.execute("COMMIT")


def _value(value: Any) -> Any:
    return {"b": base64.b64encode(value).decode()} if isinstance(value, (bytes, bytearray, memoryview)) else value


def _unvalue(value: Any) -> Any:
    return base64.b64decode(value["b"]) if isinstance(value, dict) else value


def encode(batch: ChangeBatch) -> bytes:
    lines = [json.dumps({"format": FORMAT, "version": VERSION, "first_seq": batch.first_seq,
                         "last_seq": batch.last_seq}).encode()]
    for table, key, row in batch.rows:
        lines.append(json.dumps({"t": table, "k": key, "r": None if row is None else [_value(v) for v in row]},
                                separators=(",", ":")).encode())
    body = b"\n".join(lines) + b"\n"
    return body + json.dumps({"rows": len(batch.rows), "crc32c": crc32c(body)}).encode() + b"\n"


def decode(data: bytes) -> ChangeBatch:
    """The batch in ``data``; ``ValueError`` if it is incomplete, damaged or foreign."""
    body, _, trailer = data.rstrip(b"\n").rpartition(b"\n")
    body += b"\n"
    end = json.loads(trailer)
    if end.get("crc32c") != crc32c(body):
        raise ValueError("change batch fails its CRC32C check")
    lines = body.splitlines()
    header = json.loads(lines[0])
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} version {VERSION} object")
    rows = []
    for line in lines[1:]:
        entry = json.loads(line)
        row = entry["r"]
        rows.append((str(entry["t"]), list(entry["k"]), None if row is None else [_unvalue(v) for v in row]))
    if len(rows) != end.get("rows"):
        raise ValueError("change batch is missing rows")
    return ChangeBatch(int(header["first_seq"]), int(header["last_seq"]), rows)


def apply_changes(db: sqlite3.Connection, batches: Iterator[ChangeBatch]) -> int:
    """Apply ``batches`` in order in one transaction (a restore's staging database);
    the highest sequence number applied, which the log's counter is raised to."""
    highest = last_logged_seq(db)
    db.execute("BEGIN IMMEDIATE")
    try:
        for batch in batches:
            for table, key, row in batch.rows:
                keys, columns = LOGGED_TABLES[table]
                db.execute(f"DELETE FROM {table} WHERE " + " AND ".join(f"{c} = ?" for c in keys), key)
                if row is not None:
                    db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
                               f"VALUES ({', '.join('?' for _ in columns)})", row)
            highest = max(highest, batch.last_seq)
        db.execute(f"DELETE FROM {CHANGE_LOG}")  # shipped, all of it (and what applying logged)
        if db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (highest, CHANGE_LOG)).rowcount == 0:
            db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (CHANGE_LOG, highest))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return highest

