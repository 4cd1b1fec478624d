"""``tierfs metadata export`` / ``import``: a store's metadata as a versioned stream of
JSON lines (format ``tierfs-metadata`` version 1, described in docs/METADATA_FORMAT.md).

The first line is the header, then one line per row of the metadata tables (values are
the stored protobuf records of ``records.py``, base64), then a trailer with the number
of rows, so a truncated stream is recognised.

Invariants:
- Export reads one consistent state (a single read transaction) and streams it:
  memory does not grow with the number of segments or chunks.
- Import checks the header's format and version, every line's fields and every
  record's protobuf, the trailer's row count and that every chunk belongs to an
  imported segment, all inside one transaction on the target: on any problem
  (``MetadataFormatError``) or a target that already holds segments or directories
  (``StoreNotEmptyError``) it rolls back and the store is unchanged.
- Import keeps the target's journal checkpoint (its journal is its own) and the higher
  of the two epochs, and never lowers the segment-id sequence, so an id is never reused.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from tierfs.contracts.errors import MetadataFormatError, StoreNotEmptyError
from tierfs.engine import records
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.dir_lock import DataDirLock
from tierfs.engine.record_types import Chunk, DirectoryMeta, SegmentMeta, StoreMeta

EXPORT_FORMAT = "tierfs-metadata"
EXPORT_VERSION = 1

# table -> (columns in order, the record type of the ``value`` column)
_TABLES: dict[str, tuple[tuple[str, ...], type[Any] | None]] = {
    "store": (("key", "value"), None),  # 'store' -> StoreMeta, 'root_directory' -> DirectoryMeta
    "directories": (("name", "value"), DirectoryMeta),
    "segments": (("id", "name", "rev", "value"), SegmentMeta),
    "chunks": (("segment_id", "start_offset", "value"), Chunk),
    "garbage": (("name", "queued_ns"), None),
}
_STORE_KEYS = {"store": StoreMeta, "root_directory": DirectoryMeta}


class RowSource(Protocol):
    """The metadata tables of one store, read inside one consistent read transaction."""

    def rows(self, table: str, columns: Sequence[str], where: str) -> Iterable[Sequence[Any]]: ...

    def segment_sequence(self) -> int:
        """The highest segment id ever given (ids are never reused)."""
        ...


class RowTarget(Protocol):
    """The metadata tables of one store being imported into, inside one transaction."""

    def used(self) -> int:
        """How many segments, directories and chunks it holds."""
        ...

    def insert(self, table: str, columns: Sequence[str], values: Sequence[Any]) -> None:
        """Insert (or replace) one row; ``ValueError`` with the reason when it breaks a constraint."""
        ...

    def store_value(self, key: str) -> bytes | None: ...

    def orphan_chunk(self) -> int | None:
        """The id of a segment with chunk rows but no segment row, if any."""
        ...

    def raise_sequence(self, sequence: int) -> None:
        """The segment id sequence at ``sequence`` at least (never lowered)."""
        ...


def export_metadata(database: Path, out: IO[bytes]) -> int:
    """Write ``database``'s metadata to ``out``; returns the number of rows."""
    if not database.exists():
        raise FileNotFoundError(f"no metadata at {database}")
    db = sqlite3.connect(database, isolation_level=None)  # only reads
    try:
        db.execute("BEGIN")  # one read transaction: one consistent state
        rows = write_export(_SqliteRows(db), out)
        db.execute("COMMIT")
    finally:
        db.close()
    return rows


def write_export(source: RowSource, out: IO[bytes]) -> int:
    """Write the store ``source`` reads as one export (header, rows, trailer); the number of rows."""
    write_line(out, {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                      "record_version": records.RECORD_VERSION})
    rows = 0
    for table, (columns, _) in _TABLES.items():
        # the store's binding to its tier-2 ('tier2') is the data dir's own, not metadata to move
        where = " WHERE key IN ('store', 'root_directory')" if table == "store" else ""
        for values in source.rows(table, columns, where):
            row: dict[str, Any] = {"table": table}
            for column, value in zip(columns, values, strict=True):
                row[column] = base64.b64encode(value).decode() if column == "value" else value
            write_line(out, row)
            rows += 1
    write_line(out, {"table": "sequence", "segments": source.segment_sequence()})
    write_line(out, {"end": True, "rows": rows})
    return rows


def write_line(out: IO[bytes], body: dict[str, Any]) -> None:
    out.write(json.dumps(body, sort_keys=True).encode() + b"\n")


def import_metadata(data_dir: Path, source: IO[bytes]) -> int:
    """Load an export into ``data_dir``'s (empty) store; returns the number of rows.
    Takes the data-dir lock: no daemon may serve it meanwhile."""
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        MetadataStore.sqlite(data_dir / "metadata.sqlite").close()  # the schema exists
        db = sqlite3.connect(data_dir / "metadata.sqlite", isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                lines = lines_of(source)
                rows = read_export(_SqliteRows(db), lines)
                if next(lines, None) is not None:
                    raise MetadataFormatError("lines after the trailer")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()
    finally:
        lock.release()
    return rows


def lines_of(source: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """An export's lines, numbered, each a JSON object."""
    for number, line in enumerate(source, start=1):
        try:
            body = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise MetadataFormatError(f"line {number}: not JSON ({e})") from e
        if not isinstance(body, dict):
            raise MetadataFormatError(f"line {number}: not a JSON object")
        yield number, body


def read_export(target: RowTarget, lines: Iterator[tuple[int, dict[str, Any]]]) -> int:
    """Load one export from ``lines`` (up to and with its trailer) into ``target``, checked
    line by line; the number of rows. The caller rolls back on any error."""
    header = next(lines, None)
    if header is None or header[1].get("format") != EXPORT_FORMAT:
        raise MetadataFormatError(f"not a {EXPORT_FORMAT} export (the first line is its header)")
    version = header[1].get("version")
    if version != EXPORT_VERSION:
        raise MetadataFormatError(
            f"{EXPORT_FORMAT} version {version!r} is not one this tierfs reads ({EXPORT_VERSION})"
        )
    used = target.used()
    if used:
        raise StoreNotEmptyError(f"the store holds {used} segments, directories or chunks; "
                                 "import only into an empty store")
    rows, sequence = 0, 0
    for number, body in lines:
        if body.get("end") is True:
            if body.get("rows") != rows:
                raise MetadataFormatError(f"line {number}: the trailer counts {body.get('rows')!r} rows, "
                                          f"the stream holds {rows}")
            orphan = target.orphan_chunk()
            if orphan is not None:
                raise MetadataFormatError(f"chunk records of segment id {orphan}, which the export lacks")
            target.raise_sequence(sequence)
            return rows
        table = body.get("table")
        if table == "sequence":
            sequence = _integer(number, body, "segments")
            continue
        if table not in _TABLES:
            raise MetadataFormatError(f"line {number}: unknown table {table!r}")
        _insert(target, number, table, body)
        rows += 1
    raise MetadataFormatError(f"the stream ends after {rows} rows without its trailer (truncated?)")


def _integer(number: int, body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MetadataFormatError(f"line {number}: {key!r} must be a non-negative integer")
    return value


def _insert(target: RowTarget, number: int, table: str, body: dict[str, Any]) -> None:
    columns, record_type = _TABLES[table]
    values: list[Any] = []
    for column in columns:
        if column in ("key", "name"):
            value = body.get(column)
            if not isinstance(value, str):
                raise MetadataFormatError(f"line {number}: {column!r} must be a string")
        elif column == "value":
            value = _record(number, body, table, record_type)
        else:
            value = _integer(number, body, column)
        values.append(value)
    if table == "store":
        values[1] = _merged_store_value(target.store_value(values[0]), values[0], values[1])
    try:
        target.insert(table, columns, values)
    except ValueError as e:
        raise MetadataFormatError(f"line {number}: {e}") from e


def _record(number: int, body: dict[str, Any], table: str, record_type: type[Any] | None) -> bytes:
    if table == "store":
        record_type = _STORE_KEYS.get(body.get("key"))  # type: ignore[arg-type]
        if record_type is None:
            raise MetadataFormatError(f"line {number}: unknown store key {body.get('key')!r}")
    assert record_type is not None
    try:
        data = base64.b64decode(str(body.get("value")), validate=True)
        value = records.load(record_type, data)
    except Exception as e:  # base64's binascii.Error, protobuf's DecodeError, a too new record
        raise MetadataFormatError(f"line {number}: bad {record_type.MESSAGE}: {e}") from e
    if table == "segments" and value.segment_id != body.get("id"):
        raise MetadataFormatError(f"line {number}: segment id {body.get('id')!r} differs from its record")
    return data


def _merged_store_value(local_value: bytes | None, key: str, data: bytes) -> bytes:
    """The imported store record keeps this store's journal checkpoint and the higher
    epoch; the root directory record is taken as it is."""
    if key != "store":
        return data
    imported = records.load(StoreMeta, data)
    local = records.load(StoreMeta, local_value) if local_value is not None else StoreMeta()
    return records.dump(dataclasses.replace(
        imported, epoch=max(imported.epoch, local.epoch),
        journal_checkpoint_lsn=local.journal_checkpoint_lsn,
    ))


class SqlRows:
    """What both dialects' ``RowSource``/``RowTarget`` share: the statements alike on
    SQLite and PostgreSQL (``_mark``: the connection's placeholder)."""

    _mark = "?"

    def __init__(self, db: Any) -> None:
        self._db = db

    def used(self) -> int:
        return int(self._db.execute("SELECT (SELECT count(*) FROM segments) + (SELECT count(*) FROM directories)"
                                    " + (SELECT count(*) FROM chunks)").fetchone()[0])

    def store_value(self, key: str) -> bytes | None:
        row = self._db.execute(f"SELECT value FROM store WHERE key = {self._mark}", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def orphan_chunk(self) -> int | None:
        row = self._db.execute("SELECT segment_id FROM chunks WHERE segment_id NOT IN "
                               "(SELECT id FROM segments) LIMIT 1").fetchone()
        return int(row[0]) if row else None


class _SqliteRows(SqlRows):
    """``RowSource`` and ``RowTarget`` on a SQLite metadata database."""

    def rows(self, table: str, columns: Sequence[str], where: str) -> Iterable[Sequence[Any]]:
        return self._db.execute(f"SELECT {', '.join(columns)} FROM {table}{where}")  # type: ignore[no-any-return]

    def segment_sequence(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name='segments'").fetchone()
        return int(row[0]) if row else 0

    def insert(self, table: str, columns: Sequence[str], values: Sequence[Any]) -> None:
        try:
            self._db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES "
                             f"({', '.join('?' * len(columns))})", values)
        except sqlite3.IntegrityError as e:
            raise ValueError(str(e)) from None

    def raise_sequence(self, sequence: int) -> None:
        self._db.execute("UPDATE sqlite_sequence SET seq=max(seq, ?) WHERE name='segments'", (sequence,))
        self._db.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'segments', ? WHERE NOT EXISTS "
                         "(SELECT 1 FROM sqlite_sequence WHERE name='segments')", (sequence,))
