"""Timestamps, modes and owners (issue 17 item 1) and POSIX rename (item 2), in-process.

mtime is the time of the last acknowledged append within the durable length or the
last explicit set: identical across stats, flushes, defrag, restarts (journal or
metadata) and an old journal's frames; ctime moves on metadata changes; directories'
times move with their entries. The mount and fsspec front ends are tested in
test_fuse_tools.py and test_fsspec.py.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import InvalidArgumentError, SegmentSealedError
from tierfs.contracts.reports.info import DirectoryInfo, SegmentInfo
from tierfs.engine.journal import frames as journal_format
from tierfs.engine.journal import scan as journal_scan
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import crash_copy, small_config

NO_FLUSH = dict(flush_bytes=1 << 30, flush_interval_s=3600.0, journal_file_bytes=1 << 30)


async def _segment(store: SegmentStore, name: str) -> SegmentInfo:
    info = await store.stat(name)
    assert isinstance(info, SegmentInfo)
    return info


async def _directory(store: SegmentStore, name: str) -> DirectoryInfo:
    info = await store.stat(name)
    assert isinstance(info, DirectoryInfo)
    return info


async def test_mtime_is_the_last_append_and_stays_put(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d", **NO_FLUSH)) as store:
        await store.create("log")
        before_ns = time.time_ns()
        await store.append("log", b"one\n")
        after_ns = time.time_ns()
        first = await _segment(store, "log")
        assert before_ns <= first.mtime_ns <= after_ns
        assert first.modified == first.mtime_ns / 1e9
        await trio.sleep(0.05)
        assert await _segment(store, "log") == first  # no jitter, no drift
        await store.flush("log")
        flushed = await _segment(store, "log")
        assert flushed.flushed_length == 4
        assert (flushed.mtime_ns, flushed.ctime_ns) == (first.mtime_ns, first.ctime_ns)
        await store.defrag("log")
        assert (await _segment(store, "log")).mtime_ns == first.mtime_ns
        await store.append("log", b"two\n")
        assert (await _segment(store, "log")).mtime_ns > first.mtime_ns


async def test_mtime_survives_restarts_from_the_journal_and_the_metadata(tmp_path: Path) -> None:
    data = tmp_path / "d"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create("flushed")
        await store.append("flushed", b"a")
        await store.flush("flushed")
        await store.create("journal")
        await store.append("journal", b"b")
        expected = {n: (await _segment(store, n)).mtime_ns for n in ("flushed", "journal")}
        # what a crash now leaves: "journal" only in the journal
        crash_copy(data, tmp_path / "crash")
    async with open_store(small_config(tmp_path / "crash", takeover=True, **NO_FLUSH)) as store:
        assert (await _segment(store, "journal")).flushed_length == 0
        assert {n: (await _segment(store, n)).mtime_ns for n in expected} == expected
        await store.flush()
        assert {n: (await _segment(store, n)).mtime_ns for n in expected} == expected
    async with open_store(small_config(tmp_path / "crash", takeover=True, **NO_FLUSH)) as store:
        assert {n: (await _segment(store, n)).mtime_ns for n in expected} == expected


async def test_frames_of_an_old_journal_still_replay(tmp_path: Path) -> None:
    """Kind-1 frames (no wall time) written before this version replay unchanged."""
    path = tmp_path / "old.jnl"
    data = b"old bytes"
    header = struct.pack("<QBQQ", 1, journal_format.KIND_APPEND_V1, 7, 0)
    crc = crc32c(data, crc32c(header))
    payload_len = journal_format.APPEND_V1_HEADER.size + len(data)
    path.write_bytes(struct.pack("<IIQ", payload_len, crc, 1) + header[8:] + data)
    result = journal_format.ScanResult(end_lsn=0, next_seq=1)
    frames = list(journal_scan.scan([(0, path)], 1 << 20, result))
    assert [(f.segment_id, f.offset, f.data, f.wall_ns) for f in frames] == [(7, 0, data, 0)]
    assert frames[0].end_lsn == path.stat().st_size == result.end_lsn


async def test_set_attributes_sets_times_mode_and_owner(store: SegmentStore) -> None:
    await store.create("f")
    await store.append("f", b"x")
    created = await _segment(store, "f")
    assert (created.mode, created.uid) == (0o644, created.uid)
    info = await store.set_attributes("f", atime_ns=1_000_000_001, mtime_ns=2_000_000_002)
    assert isinstance(info, SegmentInfo)
    assert (info.atime_ns, info.mtime_ns) == (1_000_000_001, 2_000_000_002)
    assert info.ctime_ns >= created.ctime_ns
    await store.flush("f")  # the flush commits an append older than the set: mtime stays
    assert (await _segment(store, "f")).mtime_ns == 2_000_000_002
    await store.append("f", b"y")  # a newer append moves it
    assert (await _segment(store, "f")).mtime_ns > 2_000_000_002
    info = await store.set_attributes("f", mode=0o600, uid=1234, gid=5678)
    assert (info.mode, info.uid, info.gid) == (0o600, 1234, 5678)
    sealed = await store.set_attributes("f", mode=0o400)  # no write bit: sealed
    assert isinstance(sealed, SegmentInfo) and sealed.sealed and sealed.mode == 0o400
    with pytest.raises(SegmentSealedError):
        await store.append("f", b"z")
    times = await store.set_attributes("f", mtime_ns=5)  # sealed segments take times too
    assert times.mtime_ns == 5
    unsealed = await store.set_attributes("f", mode=0o640)
    assert isinstance(unsealed, SegmentInfo) and not unsealed.sealed and unsealed.mode == 0o640
    await store.seal("f")  # sealed through the API: no write bit reported
    assert (await _segment(store, "f")).mode == 0o440
    for bad in ({"mode": 0o100644}, {"uid": -1}, {"mtime_ns": -5}, {"gid": 1 << 40}):
        before = await store.stat("f")
        with pytest.raises(InvalidArgumentError):
            await store.set_attributes("f", **bad)
        assert await store.stat("f") == before


async def test_times_and_modes_survive_a_restart(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d")
    async with open_store(config) as store:
        await store.mkdir("dir")
        await store.create("dir/f")
        await store.set_attributes("dir/f", mode=0o600, uid=7, gid=8, atime_ns=11, mtime_ns=22)
        await store.set_attributes("dir", mode=0o700, mtime_ns=33)
        await store.set_attributes("", mode=0o711)
        before = [await store.stat(n) for n in ("dir/f", "dir", "")]
    async with open_store(config) as store:
        assert [await store.stat(n) for n in ("dir/f", "dir", "")] == before


async def test_directory_times_follow_their_entries(store: SegmentStore) -> None:
    await store.mkdir("d")
    await store.mkdir("e")
    steps = [
        ("create", lambda: store.create("d/a"), ["d"]),
        ("mkdir", lambda: store.mkdir("d/sub"), ["d"]),
        ("rename across", lambda: store.rename("d/a", "e/a"), ["d", "e"]),
        ("rename within", lambda: store.rename("e/a", "e/b"), ["e"]),
        ("delete", lambda: store.delete("e/b"), ["e"]),
        ("rmdir", lambda: store.rmdir("d/sub"), ["d"]),
        ("create at the root", lambda: store.create("top"), [""]),
    ]
    for step, change, moved in steps:
        before = {n: await _directory(store, n) for n in ("", "d", "e")}
        await trio.sleep(0.002)
        await change()
        after = {n: await _directory(store, n) for n in ("", "d", "e")}
        for name in before:
            if name in moved:
                assert after[name].mtime_ns > before[name].mtime_ns, (step, name)
                assert after[name].ctime_ns == after[name].mtime_ns, (step, name)
            else:
                assert after[name] == before[name], (step, name)


async def test_metadata_changes_move_ctime_not_mtime(store: SegmentStore) -> None:
    await store.create("s")
    await store.append("s", b"data")
    before = await _segment(store, "s")
    await trio.sleep(0.002)
    await store.seal("s")
    sealed = await _segment(store, "s")
    assert sealed.mtime_ns == before.mtime_ns and sealed.ctime_ns > before.ctime_ns


async def test_rename_replaces_an_existing_name(store: SegmentStore) -> None:
    await store.create("new")
    await store.append("new", b"new contents")
    await store.create("old")
    await store.append("old", b"old contents")
    await store.flush()
    old_id = (await _segment(store, "old")).segment_id
    await store.rename("new", "old")
    assert await store.read("old") == b"new contents"
    assert (await _segment(store, "old")).segment_id != old_id
    assert [i.name for i in await store.list("")] == ["old"]
    assert store.table.segment_by_id(old_id) is None
    await store.mkdir("a")
    await store.create("a/x")
    await store.mkdir("b")
    await store.rename("a", "b")  # a directory onto an empty one
    assert [i.name for i in await store.list("b")] == ["b/x"]
    await store.create("sealed")
    await store.seal("sealed")
    await store.create("c")
    with pytest.raises(SegmentSealedError):
        await store.rename("c", "sealed")
    report = await store.fsck()
    assert report.problems == [], report
