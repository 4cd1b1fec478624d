"""A create commits to SQLite without an fsync and keeps a creation frame in the journal:
the journal's next sync makes it durable, and recovery puts a creation back when the
host went down before the metadata's WAL reached the disk. Simulated here by reopening
a data dir whose journal is newer than its metadata files (copied before the create):
exactly what a power loss leaves when the journal's fdatasync ran and the WAL's did not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts.errors import JournalCorruptionError, NoSpaceError, SegmentNotFoundError
from tierfs.engine.journal.frames import ScanResult, encode_append, encode_create, file_name
from tierfs.engine.journal.scan import scan
from tierfs.engine.metadata.database import UNSYNCED_COMMITS_BEFORE_CHECKPOINT
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import crash_copy as copy_running
from tierfs.testing.harness import small_config

# the crash images below are copies of a data dir: a copy opens only by taking over
NO_FLUSH = dict(flush_bytes=1 << 30, flush_interval_s=3600.0, journal_file_bytes=1 << 30, takeover=True)
METADATA_FILES = ("metadata.sqlite", "metadata.sqlite-wal", "metadata.sqlite-shm")


def copy_metadata(data_dir: Path, to: Path) -> None:
    """The metadata files as they are now (no commit is in flight: nothing flushes)."""
    to.mkdir()
    for name in METADATA_FILES:
        if (data_dir / name).exists():
            shutil.copy2(data_dir / name, to / name)


def crash_copy(data_dir: Path, metadata_copy: Path, to: Path) -> Path:
    """The data dir with its journal as it is now and its metadata as ``metadata_copy``."""
    copy_running(data_dir, to, *METADATA_FILES)
    for name in METADATA_FILES:
        if (metadata_copy / name).exists():
            shutil.copy2(metadata_copy / name, to / name)
    return to


def test_a_create_frame_round_trips_through_the_scan(tmp_path: Path) -> None:
    path = tmp_path / file_name(0)
    create = encode_create(1, 42, "logs/ä.log".encode(), b"\x08\x03record")
    append = encode_append(2, 42, 0, b"data", wall_ns=7)
    path.write_bytes(create + append + create[:-3])  # then a torn copy of the create frame
    result = ScanResult(end_lsn=0, next_seq=1)
    frames = list(scan([(0, path)], 1 << 20, result))
    assert [(f.segment_id, f.seq) for f in frames] == [(42, 1), (42, 2)]
    first = frames[0]
    assert (first.name, first.record, first.frame_lsn, first.end_lsn) == (  # type: ignore[union-attr]
        "logs/ä.log", b"\x08\x03record", 0, len(create))
    assert result.end_lsn == len(create) + len(append)
    assert result.cut == (path, len(create) + len(append))


async def test_recovery_puts_back_a_creation_the_metadata_lost(tmp_path: Path) -> None:
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.mkdir("logs")
        before = await store.stat("logs")
        copy_metadata(data, tmp_path / "metadata-before")
        await store.create_file("logs/a")  # unsynced: the mount's create
        await store.append("logs/a", b"first ")  # pd: acknowledged once the journal synced
        await store.create_file("logs/empty")
        await store.sync()
        await store.append("logs/a", b"second")
        crashed = crash_copy(data, tmp_path / "metadata-before", tmp_path / "crashed")
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:
        assert await store.read("logs/a") == b"first second"
        assert (await store.stat("logs/empty")).length == 0
        report = store.statistics().recovery
        assert report is not None and report.segments_recreated == 2
        assert [info.name for info in await store.list("logs")] == ["logs/a", "logs/empty"]
        assert (await store.stat("logs")).mtime_ns >= before.mtime_ns
        # new segments get new ids: the put-back ones are never handed out again
        await store.create("logs/b")
        await store.append("logs/b", b"b")
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:
        assert store.statistics().recovery.segments_recreated == 0  # type: ignore[union-attr]
        assert await store.read("logs/a") == b"first second"
        assert await store.read("logs/b") == b"b"


async def test_a_reopen_after_a_clean_close_looks_up_no_creation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Creations below the checkpoint a clean close records are in the metadata for sure:
    the reopen after a burst of creates costs no transaction per creation (issue 37)."""
    from tierfs.engine.metadata import replay

    data = tmp_path / "data"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        for index in range(200):
            await store.create(f"burst/s{index}", make_parents=True)
    looked_up: list[int] = []
    real = replay.recreate_segment

    def counted(metadata: object, segment_id: int, *args: object) -> bool:
        looked_up.append(segment_id)
        return real(metadata, segment_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(replay, "recreate_segment", counted)
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        assert len(await store.list("burst")) == 200
        await store.create("burst/after")  # above the checkpoint now
    assert looked_up == []
    copy_metadata(data, tmp_path / "metadata-before")
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create_file("burst/unsynced")
        await store.sync()
        crashed = crash_copy(data, tmp_path / "metadata-before", tmp_path / "crashed")
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:
        assert (await store.stat("burst/unsynced")).length == 0  # above the checkpoint: put back
    assert len(looked_up) == 1


async def test_a_creation_deleted_since_stays_deleted(tmp_path: Path) -> None:
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create_file("gone")
        await store.append("gone", b"x")
        await store.delete("gone")  # a synced commit: the creation and the deletion are on disk
        await store.create_file("kept")
        copy_running(data, tmp_path / "crashed")
    async with open_store(small_config(tmp_path / "crashed", **NO_FLUSH)) as store:
        with pytest.raises(SegmentNotFoundError):
            await store.stat("gone")
        assert (await store.stat("kept")).length == 0
        assert store.statistics().recovery.segments_recreated == 0  # type: ignore[union-attr]


async def test_a_synced_create_is_durable_when_it_returns(tmp_path: Path) -> None:
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        copy_metadata(data, tmp_path / "metadata-before")
        await store.create("api")  # the API's and the CLI's create: waits for the journal
        crashed = crash_copy(data, tmp_path / "metadata-before", tmp_path / "crashed")
    async with open_store(small_config(crashed, **NO_FLUSH)) as store:
        assert (await store.stat("api")).length == 0


async def test_an_unsynced_create_is_synced_within_the_vd_interval(store: SegmentStore) -> None:
    journal = store.journal
    await store.create_file("soon")
    assert journal.durable_lsn < journal.written_lsn  # written, not yet synced
    for _ in range(100):
        if journal.durable_lsn == journal.written_lsn:
            break
        await store.wait_for_data("soon", 0, 0.01)  # sleeps on the store's clock
    assert journal.durable_lsn == journal.written_lsn


async def test_a_creation_that_does_not_fit_the_metadata_stops_the_open(tmp_path: Path) -> None:
    """Not a state a crash leaves (the directory's creation was synced before the file's
    frame was written): metadata from elsewhere under this journal. Refused, clearly."""
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        copy_metadata(data, tmp_path / "metadata-before")
        await store.mkdir("dir")
        await store.create_file("dir/x")
        await store.sync()
        crashed = crash_copy(data, tmp_path / "metadata-before", tmp_path / "crashed")
    with pytest.raises(JournalCorruptionError, match="does not fit the metadata"):
        async with open_store(small_config(crashed, **NO_FLUSH)):
            pass


async def test_the_wal_of_a_store_that_only_creates_stays_bounded(tmp_path: Path) -> None:
    """Unsynced commits never checkpoint: after ``UNSYNCED_COMMITS_BEFORE_CHECKPOINT`` of
    them one create commits synced, in the worker thread, and SQLite checkpoints then."""
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        sizes = []
        for round_ in range(6):
            for i in range(UNSYNCED_COMMITS_BEFORE_CHECKPOINT):
                await store.create_file(f"f{round_}-{i}")
            sizes.append((data / "metadata.sqlite-wal").stat().st_size)
        # reused from its start after each checkpoint (it creeps as the b-trees deepen);
        # a checkpoint that meets the backup's read snapshot (the cycle at open) cannot
        # restart the WAL, which then holds another round until the next one does. So it
        # stops growing: without checkpoints it would grow by a round every round
        assert sizes[-1] <= 1.1 * sizes[-3] and sizes[-1] < 3 * sizes[0], sizes


async def test_a_create_the_journal_has_no_room_for_changes_nothing(
    store: SegmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(frame_bytes: int) -> None:
        raise NoSpaceError(str(store.config.data_dir), frame_bytes)

    before = await store.stat("")
    monkeypatch.setattr(store.journal, "make_room", full)
    with pytest.raises(NoSpaceError):
        await store.create_file("refused")
    monkeypatch.undo()
    with pytest.raises(SegmentNotFoundError):
        await store.stat("refused")
    assert store.metadata.database.execute("SELECT count(*) FROM segments").fetchone()[0] == 0
    assert (await store.stat("")).mtime_ns == before.mtime_ns
    await store.create_file("refused")  # the next one has room
    assert (await store.stat("refused")).length == 0
