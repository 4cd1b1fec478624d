"""The metadata contract, on both backends: SQLite in a data dir and a real PostgreSQL.
The same calls give the same answers and the same refusals, every refused change leaves
nothing behind, and on PostgreSQL two daemons racing on one database never both win."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tierfs.contracts.errors import (
    ConcurrentModificationError,
    DirectoryNotEmptyError,
    FencedError,
    MetadataVersionError,
    SegmentExistsError,
    SegmentNotFoundError,
)
from tierfs.engine.metadata.migrations import LATEST_VERSION, schema_version
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.ownership.epoch_guard import guard_epoch
from tierfs.engine.record_types import Chunk, SegmentMeta

Opener = Callable[[], MetadataStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_metadata(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens (another connection to) one fresh metadata database of the backend."""
    opened: list[MetadataStore] = []
    if request.param == "sqlite":
        def opener() -> MetadataStore:
            opened.append(MetadataStore.sqlite(tmp_path / "metadata.sqlite"))
            return opened[-1]
    else:
        url = request.getfixturevalue("postgres_url")

        def opener() -> MetadataStore:
            opened.append(MetadataStore.open(url, tmp_path / "unused.sqlite"))
            return opened[-1]
    yield opener
    for store in opened:
        store.close()


def _chunk(segment_id: int, start: int, length: int, name: str = "") -> Chunk:
    return Chunk(segment_id=segment_id, start_offset=start, length=length,
                 name=name or f"s{segment_id}/e1-c{start}")


def test_names_parents_and_collisions(open_metadata: Opener) -> None:
    meta = open_metadata()
    meta.mkdir("d", "")
    meta.create_segment("d/a", "d", SegmentMeta())
    for clash in ("d", "d/a"):
        with pytest.raises(SegmentExistsError):
            meta.create_segment(clash, "", SegmentMeta())
        with pytest.raises(SegmentExistsError):
            meta.mkdir(clash, "")
    with pytest.raises(SegmentNotFoundError):
        meta.create_segment("missing/x", "missing", SegmentMeta())
    with pytest.raises(DirectoryNotEmptyError):
        meta.rmdir("d")
    assert [r.name for r in meta.load_segments()] == ["d/a"]
    assert list(meta.load_directories()) == ["d"]


def test_renames_match_names_literally(open_metadata: Opener) -> None:
    """LIKE patterns are escaped: a directory named ``a_%`` moves only what is below it."""
    meta = open_metadata()
    for directory in ("a_%", "ab%", "a\\b"):
        meta.mkdir(directory, "")
        meta.create_segment(f"{directory}/x", directory, SegmentMeta())
    meta.rename("a_%", "moved", "", is_directory=True)
    names = sorted(r.name for r in meta.load_segments())
    assert names == ["a\\b/x", "ab%/x", "moved/x"]
    with pytest.raises(DirectoryNotEmptyError):
        meta.rmdir("ab%")
    meta.rename("ab%/x", "moved/y", "moved", is_directory=False)
    meta.rmdir("ab%")
    with pytest.raises(SegmentExistsError):
        meta.rename("moved/x", "moved/y", "moved", is_directory=False)


def test_conditional_updates_refuse_stale_revisions_and_change_nothing(open_metadata: Opener) -> None:
    meta = open_metadata()
    row = meta.create_segment("s", "", SegmentMeta())
    sid = row.segment_id
    grown = dataclasses.replace(row.record, flushed_length=10)
    rev = meta.commit_flush(row, grown, _chunk(sid, 0, 10))
    stale = row  # still at revision 1
    with pytest.raises(ConcurrentModificationError):
        meta.commit_flush(stale, dataclasses.replace(grown, flushed_length=20), _chunk(sid, 10, 10))
    with pytest.raises(ConcurrentModificationError):
        meta.delete_segment(stale)
    assert [c.start_offset for c in meta.load_chunks(sid)] == [0]
    (current,) = meta.load_segments()
    assert current.rev == rev and current.record.flushed_length == 10
    meta.delete_segment(current)
    assert meta.load_chunks(sid) == [] and meta.load_segments() == []
    assert sorted(meta.garbage()) == [f"s{sid}/e1-c0"]


def test_concat_and_defrag_swaps_are_all_or_nothing(open_metadata: Opener) -> None:
    meta = open_metadata()
    target = meta.create_segment("t", "", SegmentMeta())
    source = meta.create_segment("src", "", SegmentMeta())
    rev = meta.commit_flush(source, dataclasses.replace(source.record, flushed_length=5), _chunk(source.segment_id, 0, 5))
    (source,) = [r for r in meta.load_segments() if r.name == "src"]
    moved = [dataclasses.replace(_chunk(source.segment_id, 0, 5), segment_id=target.segment_id)]
    stale_source = dataclasses.replace(source, rev=rev - 1)
    with pytest.raises(ConcurrentModificationError):
        meta.concat(target, dataclasses.replace(target.record, flushed_length=5), [stale_source], moved)
    assert meta.load_chunks(target.segment_id) == [] and len(meta.load_segments()) == 2
    meta.concat(target, dataclasses.replace(target.record, flushed_length=5), [source], moved)
    assert [r.name for r in meta.load_segments()] == ["t"]
    assert [c.segment_id for c in meta.load_chunks(target.segment_id)] == [target.segment_id]

    (target,) = meta.load_segments()
    old = meta.load_chunks(target.segment_id)
    changed = [dataclasses.replace(old[0], length=4)]  # not what is stored
    merged = _chunk(target.segment_id, 0, 5, name="merged")
    with pytest.raises(ConcurrentModificationError):
        meta.replace_chunks(target, target.record, changed, merged, collect_after_ns=0)
    assert meta.load_chunks(target.segment_id) == old
    meta.replace_chunks(target, target.record, old, merged, collect_after_ns=0)
    assert [c.name for c in meta.load_chunks(target.segment_id)] == ["merged"]


def test_ids_are_never_reused_and_the_checkpoint_never_goes_back(open_metadata: Opener) -> None:
    meta = open_metadata()
    first = meta.create_segment("a", "", SegmentMeta())
    meta.delete_segment(first)
    meta.set_checkpoint(100)
    meta.set_checkpoint(50)
    meta.close()
    again = open_metadata()
    second = again.create_segment("a", "", SegmentMeta())
    assert second.segment_id > first.segment_id
    assert second.record.segment_id == second.segment_id
    assert again.load_store_record().journal_checkpoint_lsn == 100
    assert again.begin_epoch(at_least=7).epoch == 7
    assert again.begin_epoch().epoch == 8


def test_the_schema_is_versioned_and_a_newer_one_is_refused(open_metadata: Opener) -> None:
    meta = open_metadata()
    assert schema_version(meta.database) == LATEST_VERSION
    meta.database.execute("UPDATE schema_version SET version = ?", (LATEST_VERSION + 1,))
    meta.create_segment("kept", "", SegmentMeta())
    with pytest.raises(MetadataVersionError, match=f"schema version {LATEST_VERSION + 1}"):
        open_metadata()
    assert [r.name for r in meta.load_segments()] == ["kept"]


def test_a_data_dir_from_before_versioning_opens_as_version_1(tmp_path: Path) -> None:
    path = tmp_path / "metadata.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE store (key TEXT PRIMARY KEY, value BLOB NOT NULL);
        CREATE TABLE directories (name TEXT PRIMARY KEY, value BLOB NOT NULL);
        CREATE TABLE segments (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
                               rev INTEGER NOT NULL, value BLOB NOT NULL);
        CREATE TABLE chunks (segment_id INTEGER NOT NULL, start_offset INTEGER NOT NULL,
                             value BLOB NOT NULL, PRIMARY KEY (segment_id, start_offset));
        CREATE TABLE garbage (name TEXT PRIMARY KEY, queued_ns INTEGER NOT NULL);
    """)
    db.close()
    meta = MetadataStore.sqlite(path)
    meta.create_segment("old", "", SegmentMeta())
    meta.close()
    meta = MetadataStore.sqlite(path)
    assert schema_version(meta.database) == LATEST_VERSION
    assert [r.name for r in meta.load_segments()] == ["old"]
    meta.close()


# ---------------------------------------------------------------- two daemons, one database
def _race(first: Callable[[], Any], second: Callable[[], Any]) -> list[Any]:
    """Run both at once; each result is its return value or the exception it raised."""
    results: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except Exception as e:
            results[index] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_racing_daemons_never_both_win_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    one = MetadataStore.open(postgres_url, tmp_path / "unused")
    two = MetadataStore.open(postgres_url, tmp_path / "unused")
    try:
        for round_number in range(20):
            name = f"seg-{round_number}"
            results = _race(lambda n=name: one.create_segment(n, "", SegmentMeta()),
                            lambda n=name: two.create_segment(n, "", SegmentMeta()))
            assert sum(isinstance(r, SegmentExistsError) for r in results) == 1, results

            (row,) = [r for r in one.load_segments() if r.name == name]
            results = _race(
                lambda r=row: one.commit_flush(r, dataclasses.replace(r.record, flushed_length=1), _chunk(r.segment_id, 0, 1)),
                lambda r=row: two.commit_flush(r, dataclasses.replace(r.record, flushed_length=2), _chunk(r.segment_id, 0, 2)),
            )
            assert sum(isinstance(r, ConcurrentModificationError) for r in results) == 1, results
            (chunk,) = one.load_chunks(row.segment_id)
            (after,) = [r for r in two.load_segments() if r.name == name]
            assert after.record.flushed_length == chunk.length  # the winner's record and chunk, together

            directory = f"dir-{round_number}"
            one.mkdir(directory, "")
            results = _race(lambda d=directory: one.rmdir(d),
                            lambda d=directory: two.create_segment(f"{d}/x", d, SegmentMeta()))
            segments = {r.name for r in one.load_segments()}
            directories = set(one.load_directories())
            # never a segment below a removed directory
            assert not (f"{directory}/x" in segments and directory not in directories), results
    finally:
        one.close()
        two.close()


def test_an_old_owner_commits_nothing_once_a_new_owner_began_its_epoch(open_metadata: Opener) -> None:
    """The epoch guard: after another owner began a newer epoch, every transaction of
    the old one is refused with ``fenced`` before it changes anything."""
    old = open_metadata()
    old_epoch = old.begin_epoch().epoch
    guard_epoch(old, old_epoch)
    row = old.create_segment("kept", "", SegmentMeta())
    old.commit_flush(row, dataclasses.replace(row.record, flushed_length=4), _chunk(row.segment_id, 0, 4))
    old.close()  # SQLite: one connection writes at a time; the data-dir lock already keeps two apart
    new = open_metadata()
    assert new.begin_epoch().epoch == old_epoch + 1
    zombie = open_metadata()
    guard_epoch(zombie, old_epoch)
    stale = zombie.find_segment("kept")
    assert stale is not None
    attempts: list[Callable[[], Any]] = [
        lambda: zombie.create_segment("zombie", "", SegmentMeta()),
        lambda: zombie.commit_flush(stale, dataclasses.replace(stale.record, flushed_length=8),
                                    _chunk(stale.segment_id, 4, 4, "s1/e1-c9")),
        lambda: zombie.delete_segment(stale),
        lambda: zombie.set_checkpoint(1 << 30),
        lambda: zombie.mkdir("d", ""),
    ]
    for attempt in attempts:
        with pytest.raises(FencedError):
            attempt()
    assert new.find_segment("zombie") is None
    kept = new.find_segment("kept")
    assert kept is not None and kept.record.flushed_length == 4
    assert [c.length for c in new.load_chunks(kept.segment_id)] == [4]
    assert new.load_store_record().journal_checkpoint_lsn == 0
    guard_epoch(new, old_epoch + 1)
    new.create_segment("by the new owner", "", SegmentMeta())  # the current owner commits


def test_a_postgresql_connection_that_died_while_idle_is_replaced_but_no_write_is_sent_twice(
        postgres_url: str) -> None:
    """The server ended the connection while it was idle (as a restart does): the next
    transaction's BEGIN and a lone read run again on a new connection; a lone write fails
    (it may have been sent) and the call after it reconnects."""
    import psycopg

    from tierfs.contracts.errors import MetadataUnavailableError
    from tierfs.engine.metadata.database import PostgresDatabase

    def end_its_connection() -> None:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND application_name = 'tierfs'").fetchone()
        assert ended == (1,)

    db = PostgresDatabase(postgres_url)
    try:
        db.execute("CREATE TABLE t (x INTEGER)")
        end_its_connection()
        with db.transaction():
            db.execute("INSERT INTO t VALUES (1)")
        end_its_connection()
        assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)
        end_its_connection()
        with pytest.raises(MetadataUnavailableError):
            db.execute("INSERT INTO t VALUES (2)")
        assert db.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        db.close()
