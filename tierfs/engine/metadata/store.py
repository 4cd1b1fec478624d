"""Metadata: segment, directory and chunk records in a database: SQLite in the data dir
(WAL, synchronous=FULL; the default) or PostgreSQL (``--metadata postgresql://...``),
with the same statements and the same conditional checks on both (``metadata.database``).

This is the only index of the store: nothing lists tier-2 to find data.

Invariants:
- Values are protobuf records (``records.py``) carrying a version; this is the one
  place they are converted to and from the engine's typed values (``record_types``),
  once per load or commit, never per read or append.
- Every change that touches more than one row runs in one transaction; updates of a
  segment are conditional on its revision, so a stale writer fails instead of
  overwriting (``ConcurrentModificationError``) and changes nothing.
- A garbage name is returned for collection only once its ``queued_ns`` has passed
  (defrag queues old chunks with a deletion lag, readers may still hold them).
- Segment ids come from AUTOINCREMENT (an identity column on PostgreSQL) and are never
  reused, so journal frames of a deleted segment can never be mistaken for another
  segment's bytes.
- Changes that check a name is free or a directory is empty run under the namespace
  lock (``transaction(namespace=True)``), so those checks hold at commit even when
  several daemons share one PostgreSQL database.
- The schema is brought to the newest version when the store opens (``metadata.migrations``).
- A transaction the disk has no room for (SQLITE_FULL, at any statement or at COMMIT)
  is rolled back and raises ``NoSpaceError``: nothing changed, the next one retries,
  with the data dir's space reserve (``space_reserve``) released for it; the reserve is
  re-made after the next commit that finds room.
- Methods here block (SQLite + fsync, or a PostgreSQL round trip); the store calls them from one worker thread at a
  time through a limiter, which also serializes use of the connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

from tierfs.contracts.errors import (
    ConcurrentModificationError,
    DirectoryNotEmptyError,
    SegmentExistsError,
    SegmentNotFoundError,
)
from tierfs.contracts.names import detached_name
from tierfs.engine import records
from tierfs.engine.clock import now_ns
from tierfs.engine.metadata.database import POSTGRESQL, Database, escape_like, open_database
from tierfs.engine.metadata.migrations import migrate
from tierfs.engine.object_keys import (
    garbage_names,
)
from tierfs.engine.record_types import Chunk, DirectoryMeta, SegmentMeta, SegmentRow, StoreMeta
from tierfs.engine.space_reserve import SpaceReserve


class MetadataStore:
    """The metadata on a ``Database``: SQLite in the data dir, or PostgreSQL."""

    def __init__(self, db: Database) -> None:
        self._db = db
        migrate(db)

    @classmethod
    def open(cls, url: str, sqlite_path: Path, reserve: SpaceReserve | None = None) -> MetadataStore:
        """``url`` as in ``metadata.database.open_database``; the schema is migrated."""
        db = open_database(url, sqlite_path, reserve)
        try:
            return cls(db)
        except BaseException:
            db.close()
            raise

    @classmethod
    def sqlite(cls, path: Path, reserve: SpaceReserve | None = None) -> MetadataStore:
        return cls.open("sqlite:", path, reserve)

    @property
    def database(self) -> Database:
        return self._db

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ store record
    def load_store_record(self) -> StoreMeta:
        row = self._db.execute("SELECT value FROM store WHERE key='store'").fetchone()
        if row is None:
            return StoreMeta(created_ns=now_ns())
        return records.load(StoreMeta, row[0])

    def save_store_record(self, record: StoreMeta) -> None:
        with self._db.transaction():
            self._write_store_record(record)

    def _write_store_record(self, record: StoreMeta) -> None:
        """Caller holds a transaction."""
        self._db.execute(
            "INSERT INTO store (key, value) VALUES ('store', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (records.dump(record),),
        )

    def begin_epoch(self, at_least: int = 0, *, foreign_before: bool = False) -> StoreMeta:
        """Increase the owner epoch, to ``at_least`` if higher (the epoch claimed on
        tier-2), in one transaction; return the store record. ``foreign_before``: the
        previous owner was another data dir, whose metadata may reference objects this
        one never saw: objects of every earlier epoch are no longer this store's to
        collect (``foreign_below_epoch``)."""
        with self._db.transaction():
            old = self.load_store_record()
            self._db.execute("DELETE FROM store WHERE key='restored_from'")
            record = dataclasses.replace(old, epoch=max(old.epoch + 1, at_least))
            if foreign_before:
                record = dataclasses.replace(record, foreign_below_epoch=record.epoch)
            self._write_store_record(record)
        return record

    def parent_epoch(self) -> int:
        """The epoch whose metadata the next epoch continues: the last one, or after a
        restore the lineage restored (the record's epoch was raised above every epoch
        tier-2 shows, siblings' included)."""
        row = self._db.execute("SELECT value FROM store WHERE key='restored_from'").fetchone()
        return int(bytes(row[0]).decode()) if row is not None else self.load_store_record().epoch

    def mark_restored_from(self, epoch: int) -> None:
        with self._db.transaction():
            self._db.execute("INSERT INTO store (key, value) VALUES ('restored_from', ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(epoch).encode(),))

    def bind_tier2(self, tier2_url: str, *, rebind: bool = False) -> str:
        """Record ``tier2_url`` as the one tier-2 this metadata describes, if none is
        recorded yet (or ``rebind``: a restore from that tier-2); return the recorded one
        (the caller refuses a different one)."""
        with self._db.transaction(namespace=True):
            row = self._db.execute("SELECT value FROM store WHERE key='tier2'").fetchone()
            if row is not None and not rebind:
                return bytes(row[0]).decode()
            self._db.execute("INSERT INTO store (key, value) VALUES ('tier2', ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (tier2_url.encode(),))
        return tier2_url

    # ------------------------------------------------------------ namespace
    def load_root_directory(self) -> DirectoryMeta:
        row = self._db.execute("SELECT value FROM store WHERE key='root_directory'").fetchone()
        return DirectoryMeta() if row is None else records.load(DirectoryMeta, row[0])

    def update_directory(self, name: str, record: DirectoryMeta) -> None:
        """Replace a directory's record ('' is the root)."""
        with self._db.transaction():
            self.write_directories({name: record})

    def write_directories(self, updates: dict[str, DirectoryMeta] | None) -> None:
        """Replace directory records inside the caller's transaction: the parents whose
        times a namespace change moves commit with the change."""
        for name, record in (updates or {}).items():
            if name == "":
                self._db.execute(
                    "INSERT INTO store (key, value) VALUES ('root_directory', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (records.dump(record),),
                )
                continue
            cursor = self._db.execute(
                "UPDATE directories SET value=? WHERE name=?", (records.dump(record), name)
            )
            if cursor.rowcount != 1:
                raise SegmentNotFoundError(name)

    def load_directories(self) -> dict[str, DirectoryMeta]:
        """Every directory's record; one made before directories had ids gets one now
        (and the id sequence is kept above every directory's: a restore may have
        brought it back below)."""
        loaded = {
            name: records.load(DirectoryMeta, value)
            for name, value in self._db.execute("SELECT name, value FROM directories")
        }
        unnumbered = sorted(name for name, record in loaded.items() if not record.directory_id)
        highest = max((record.directory_id for record in loaded.values()), default=0)
        if not unnumbered and highest <= self._current_id():
            return loaded
        with self._db.transaction(namespace=True):
            while self._current_id() < highest:
                self._next_id()
            for name in unnumbered:
                loaded[name] = dataclasses.replace(loaded[name], directory_id=self._next_id())
            self.write_directories({name: loaded[name] for name in unnumbered})
        return loaded

    def _next_id(self) -> int:
        """A new id from the segments' id sequence (caller holds a transaction):
        directories number themselves from it too, so an id names one entry ever."""
        if self._db.dialect == POSTGRESQL:
            return int(self._db.execute("SELECT nextval(pg_get_serial_sequence('segments', 'id'))").fetchone()[0])
        self._db.execute("INSERT INTO sqlite_sequence (name, seq) SELECT 'segments', 0 "
                         "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'segments')")
        return int(self._db.execute(
            "UPDATE sqlite_sequence SET seq = seq + 1 WHERE name = 'segments' RETURNING seq").fetchone()[0])

    def _current_id(self) -> int:
        """The last id the sequence gave (0: none yet)."""
        if self._db.dialect == POSTGRESQL:
            sequence = self._db.execute("SELECT pg_get_serial_sequence('segments', 'id')").fetchone()[0]
            last, called = self._db.execute(f"SELECT last_value, is_called FROM {sequence}").fetchone()
            return int(last) if called else 0
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'segments'").fetchone()
        return int(row[0]) if row is not None else 0

    def load_segments(self) -> list[SegmentRow]:
        return [
            SegmentRow(seg_id, name, rev, records.load(SegmentMeta, value))
            for seg_id, name, rev, value in self._db.execute(
                "SELECT id, name, rev, value FROM segments"
            )
        ]

    def find_segment(self, name: str) -> SegmentRow | None:
        """One segment's row by name (an index lookup), or None."""
        row = self._db.execute("SELECT id, name, rev, value FROM segments WHERE name=?", (name,)).fetchone()
        return None if row is None else SegmentRow(row[0], row[1], row[2], records.load(SegmentMeta, row[3]))

    def name_taken(self, name: str) -> bool:
        """Whether a directory or a segment has ``name`` (inside the caller's namespace
        transaction, so the answer holds at its commit)."""
        return (
            self._db.execute("SELECT 1 FROM directories WHERE name=?", (name,)).fetchone()
            is not None
            or self._db.execute("SELECT 1 FROM segments WHERE name=?", (name,)).fetchone()
            is not None
        )

    def _require_parent(self, parent: str) -> None:
        if parent and self._db.execute(
            "SELECT 1 FROM directories WHERE name=?", (parent,)
        ).fetchone() is None:
            raise SegmentNotFoundError(parent)

    def mkdir(self, name: str, parent: str, touched: dict[str, DirectoryMeta] | None = None) -> DirectoryMeta:
        stamp = now_ns()
        with self._db.transaction(namespace=True):
            self._require_parent(parent)
            if self.name_taken(name):
                raise SegmentExistsError(name)
            record = DirectoryMeta(created_ns=stamp, modified_ns=stamp, changed_ns=stamp, directory_id=self._next_id())
            self._db.execute(
                "INSERT INTO directories (name, value) VALUES (?, ?)",
                (name, records.dump(record)),
            )
            self.write_directories(touched)
        return record

    def rmdir(self, name: str, touched: dict[str, DirectoryMeta] | None = None) -> None:
        with self._db.transaction(namespace=True):
            self._remove_empty_directory(name)
            self.write_directories(touched)

    def _remove_empty_directory(self, name: str) -> None:
        pattern = escape_like(name) + "/%"
        for table in ("directories", "segments"):
            if self._db.execute(
                f"SELECT 1 FROM {table} WHERE name LIKE ? ESCAPE '\\' LIMIT 1", (pattern,)
            ).fetchone():
                raise DirectoryNotEmptyError(name)
        cursor = self._db.execute("DELETE FROM directories WHERE name=?", (name,))
        if cursor.rowcount != 1:
            raise SegmentNotFoundError(name)

    def create_segment(
        self, name: str, parent: str, record: SegmentMeta, touched: dict[str, DirectoryMeta] | None = None,
        *, synced: bool = True,
    ) -> SegmentRow:
        """Insert a segment; the row's record is ``record`` with its new segment id.
        ``synced=False`` (SQLite): not on disk yet when this returns; the caller keeps
        the creation in the journal until it is (``replay.recreate_from_journal``)."""
        with self._db.transaction(namespace=True, synced=synced):
            self._require_parent(parent)
            row = self._insert_segment(name, record)
            self.write_directories(touched)
        return row

    def _insert_segment(self, name: str, record: SegmentMeta) -> SegmentRow:
        if self.name_taken(name):
            raise SegmentExistsError(name)
        segment_id = int(self._db.execute(
            "INSERT INTO segments (name, rev, value) VALUES (?, 1, ?) RETURNING id",
            (name, records.dump(record)),
        ).fetchone()[0])
        record = dataclasses.replace(record, segment_id=segment_id)
        self._db.execute(
            "UPDATE segments SET value=? WHERE id=?", (records.dump(record), segment_id)
        )
        return SegmentRow(segment_id, name, 1, record)

    def replace_segment(
        self, replaced: SegmentRow, detach: bool, record: SegmentMeta, touched: dict[str, DirectoryMeta]
    ) -> tuple[SegmentRow, list[str]]:
        """A new segment (``record``) under ``replaced``'s name, in one transaction:
        ``replaced`` is detached (``detach``: still held) or deleted, its chunks queued
        for collection (returned)."""
        with self._db.transaction(namespace=True):
            garbage = self._remove_replaced(replaced, detach)
            row = self._insert_segment(replaced.name, record)
            self.write_directories(touched)
        return row, garbage

    def detach_segment(self, row: SegmentRow, touched: dict[str, DirectoryMeta] | None = None) -> str:
        """Move a held segment that is being deleted to its detached name (returned)."""
        with self._db.transaction(namespace=True):
            self._remove_replaced(row, detach=True)
            self.write_directories(touched)
        return detached_name(row.segment_id)

    def _remove_replaced(self, row: SegmentRow, detach: bool) -> list[str]:
        """Delete ``row`` (its garbage returned) or, with ``detach``, move it to its
        detached name (``names.detached_name``: nothing)."""
        if not detach:
            return self._delete_segment(row)
        cursor = self._db.execute(
            "UPDATE segments SET name=? WHERE id=? AND rev=?", (detached_name(row.segment_id), row.segment_id, row.rev)
        )
        if cursor.rowcount != 1:
            raise ConcurrentModificationError(f"segment {row.name!r} changed meanwhile")
        return []

    def update_segment(self, row: SegmentRow, record: SegmentMeta) -> int:
        """Conditionally replace a segment's record; returns the new revision."""
        with self._db.transaction():
            return self._update_segment(row, record)

    def _update_segment(self, row: SegmentRow, record: SegmentMeta) -> int:
        cursor = self._db.execute(
            "UPDATE segments SET value=?, rev=rev+1 WHERE id=? AND rev=?",
            (records.dump(record), row.segment_id, row.rev),
        )
        if cursor.rowcount != 1:
            raise ConcurrentModificationError(
                f"segment {row.name!r} (id {row.segment_id}) changed or vanished "
                f"since revision {row.rev}"
            )
        return row.rev + 1

    def rename(
        self,
        old: str,
        new: str,
        new_parent: str,
        is_directory: bool,
        replaced: SegmentRow | None = None,
        replaces_directory: bool = False,
        touched: dict[str, DirectoryMeta] | None = None,
        detach_replaced: bool = False,
        moving: SegmentRow | None = None,
        moved_record: SegmentMeta | None = None,
    ) -> tuple[list[str], int]:
        """Rename a segment, or a directory with everything below it, in one transaction.

        ``new`` must be free, or hold exactly what the caller saw: the segment
        ``replaced`` (at its revision; deleted in the same transaction, its chunks
        queued for collection: returned; with ``detach_replaced`` moved to its detached
        name instead) or, with ``replaces_directory``, an empty directory (removed).
        A segment ``moving`` (at its revision) takes ``moved_record`` (its new ctime);
        the new revision is returned (0 for a directory)."""
        garbage: list[str] = []
        revision = 0
        with self._db.transaction(namespace=True):
            self._require_parent(new_parent)
            if replaced is not None:
                garbage = self._remove_replaced(replaced, detach_replaced)
            elif replaces_directory:
                self._remove_empty_directory(new)
            if self.name_taken(new):
                raise SegmentExistsError(new)
            if moving is not None and moved_record is not None:
                cursor = self._db.execute("UPDATE segments SET name=?, value=?, rev=rev+1 WHERE id=? AND rev=?",
                                          (new, records.dump(moved_record), moving.segment_id, moving.rev))
                if cursor.rowcount != 1:
                    raise ConcurrentModificationError(f"segment {old!r} changed meanwhile")
                revision = moving.rev + 1
            else:
                table = "directories" if is_directory else "segments"
                cursor = self._db.execute(f"UPDATE {table} SET name=? WHERE name=?", (new, old))
                if cursor.rowcount != 1:
                    raise SegmentNotFoundError(old)
            if is_directory:
                pattern = escape_like(old) + "/%"
                for inner in ("directories", "segments"):
                    self._db.execute(
                        f"UPDATE {inner} SET name=? || substr(name, ?) "
                        f"WHERE name LIKE ? ESCAPE '\\'",
                        (new, len(old) + 1, pattern),
                    )
            self.write_directories(touched)
        return garbage, revision

    def delete_segment(self, row: SegmentRow, touched: dict[str, DirectoryMeta] | None = None) -> list[str]:
        """Delete a segment and its chunk records; queue its chunks for collection."""
        with self._db.transaction():
            names = self._delete_segment(row)
            self.write_directories(touched)
        return names

    def _delete_segment(self, row: SegmentRow) -> list[str]:
        names = [n for c in self._chunks(row.segment_id) for n in garbage_names(c)]
        cursor = self._db.execute(
            "DELETE FROM segments WHERE id=? AND rev=?", (row.segment_id, row.rev)
        )
        if cursor.rowcount != 1:
            raise ConcurrentModificationError(f"segment {row.name!r} changed meanwhile")
        self._db.execute("DELETE FROM chunks WHERE segment_id=?", (row.segment_id,))
        self._insert_garbage(names, now_ns())
        return names

    # ------------------------------------------------------------ chunks
    def _chunks(self, segment_id: int) -> Iterator[Chunk]:
        for (value,) in self._db.execute(
            "SELECT value FROM chunks WHERE segment_id=? ORDER BY start_offset", (segment_id,)
        ):
            yield records.load(Chunk, value)

    def load_chunks(self, segment_id: int) -> list[Chunk]:
        return list(self._chunks(segment_id))

    def commit_flush(self, row: SegmentRow, record: SegmentMeta, chunk: Chunk) -> int:
        """Record a chunk write (new chunk or grown chunk) and the segment's new flushed
        length in one transaction; conditional on the segment revision."""
        return self.commit_flushes([(row, record, chunk)])[0]

    def commit_flushes(self, flushes: Sequence[tuple[SegmentRow, SegmentMeta, Chunk]]) -> list[int]:
        """``commit_flush`` for many segments in one transaction, all or nothing (each
        conditional on its revision); the new revisions, in order."""
        with self._db.transaction():
            revisions = [self._update_segment(row, record) for row, record, _ in flushes]
            self._db.executemany(
                "INSERT INTO chunks (segment_id, start_offset, value) VALUES (?, ?, ?) "
                "ON CONFLICT (segment_id, start_offset) DO UPDATE SET value = excluded.value",
                [(chunk.segment_id, chunk.start_offset, records.dump(chunk)) for _, _, chunk in flushes],
            )
        return revisions

    def commit_chunk_update(self, row: SegmentRow, chunk: Chunk) -> int:
        """Replace an existing chunk record (offload progress), conditional on the
        segment revision, which it advances; returns the new revision."""
        with self._db.transaction():
            rev = self._update_segment(row, row.record)
            cursor = self._db.execute(
                "UPDATE chunks SET value=? WHERE segment_id=? AND start_offset=?",
                (records.dump(chunk), chunk.segment_id, chunk.start_offset),
            )
            if cursor.rowcount != 1:
                raise ConcurrentModificationError(
                    f"chunk {chunk.name} of segment {row.name!r} is gone"
                )
        return rev

    def concat(
        self, target: SegmentRow, target_record: SegmentMeta, sources: list[SegmentRow], moved: list[Chunk]
    ) -> int:
        """Metadata-only concat: ``moved`` (the sources' chunk records, re-addressed to
        the target) join the target, the target gets its new record and the sources
        disappear, in one transaction conditional on every revision. No object is
        touched. Returns the target's new revision."""
        with self._db.transaction():
            rev = self._update_segment(target, target_record)
            for source in sources:
                cursor = self._db.execute(
                    "DELETE FROM segments WHERE id=? AND rev=?", (source.segment_id, source.rev)
                )
                if cursor.rowcount != 1:
                    raise ConcurrentModificationError(f"segment {source.name!r} changed meanwhile")
                self._db.execute("DELETE FROM chunks WHERE segment_id=?", (source.segment_id,))
            self._db.executemany(
                "INSERT INTO chunks (segment_id, start_offset, value) VALUES (?, ?, ?)",
                [(c.segment_id, c.start_offset, records.dump(c)) for c in moved],
            )
        return rev

    def truncate_head(self, row: SegmentRow, record: SegmentMeta, chunks: list[Chunk]) -> int:
        """Delete head ``chunks`` (retention) and set the segment's new record (its
        start offset) in one transaction; their objects are queued for collection."""
        stamp = now_ns()
        with self._db.transaction():
            rev = self._update_segment(row, record)
            for chunk in chunks:
                self._db.execute(
                    "DELETE FROM chunks WHERE segment_id=? AND start_offset=?",
                    (chunk.segment_id, chunk.start_offset),
                )
            self._insert_garbage([name for chunk in chunks for name in garbage_names(chunk)], stamp)
        return rev

    def replace_chunks(
        self, row: SegmentRow, record: SegmentMeta, old: list[Chunk], merged: Chunk, collect_after_ns: int
    ) -> int:
        """Defrag's swap: the adjacent chunk records ``old`` become the one record
        ``merged``, with the segment's new record, in one transaction conditional on the
        segment revision and on every old record being stored exactly as given. The old
        objects are queued as garbage, collectable from ``collect_after_ns``."""
        with self._db.transaction():
            rev = self._update_segment(row, record)
            for chunk in old:
                stored = self._db.execute(
                    "SELECT value FROM chunks WHERE segment_id=? AND start_offset=?",
                    (chunk.segment_id, chunk.start_offset),
                ).fetchone()
                if stored is None or records.load(Chunk, stored[0]) != chunk:
                    raise ConcurrentModificationError(
                        f"chunk {chunk.name} of segment {row.name!r} changed during defrag"
                    )
                self._db.execute(
                    "DELETE FROM chunks WHERE segment_id=? AND start_offset=?",
                    (chunk.segment_id, chunk.start_offset),
                )
            self._db.execute(
                "INSERT INTO chunks (segment_id, start_offset, value) VALUES (?, ?, ?)",
                (merged.segment_id, merged.start_offset, records.dump(merged)),
            )
            self._insert_garbage([n for chunk in old for n in garbage_names(chunk)], collect_after_ns)
        return rev

    # ------------------------------------------------------------ garbage
    def queue_garbage(self, names: list[str]) -> None:
        with self._db.transaction():
            self._insert_garbage(names, now_ns())

    def _insert_garbage(self, names: list[str], stamp: int) -> None:
        """Caller holds a transaction."""
        self._db.executemany(
            "INSERT INTO garbage (name, queued_ns) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            [(name, stamp) for name in names],
        )

    def garbage(self, limit: int = 1000) -> list[str]:
        """Queued names whose time has come (defrag queues with a deletion lag)."""
        return [
            n for (n,) in self._db.execute(
                "SELECT name FROM garbage WHERE queued_ns <= ? LIMIT ?", (now_ns(), limit)
            )
        ]

    def forget_garbage(self, names: list[str]) -> None:
        with self._db.transaction():
            self._db.executemany("DELETE FROM garbage WHERE name=?", [(n,) for n in names])

    def last_change_seq(self) -> int:
        """The change log's last sequence number, pruned or not (SQLite metadata only)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'change_log'").fetchone()
        return int(row[0]) if row is not None else 0

    def prune_change_log(self, up_to_seq: int) -> None:
        """Forget the changes up to ``up_to_seq``: they are on tier-2 (``metadata.change_log``)."""
        with self._db.transaction():
            self._db.execute("DELETE FROM change_log WHERE seq <= ?", (up_to_seq,))

    def set_checkpoint(self, lsn: int) -> None:
        with self._db.transaction():
            record = self.load_store_record()
            if lsn > record.journal_checkpoint_lsn:
                self._write_store_record(dataclasses.replace(record, journal_checkpoint_lsn=lsn))
