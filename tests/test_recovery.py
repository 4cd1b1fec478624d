"""Recovery from the journal, including journals torn at many byte offsets."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import JournalCorruptionError, SegmentNotFoundError
from tierfs.engine.journal.frames import FRAME_OVERHEAD, list_files
from tierfs.engine.recovery.lost_found import entries as lost_found_entries
from tierfs.testing.harness import crash_copy, small_config

# the crash images below are copies of a data dir: a copy opens only by taking over
NO_FLUSH = dict(flush_bytes=1 << 30, flush_interval_s=3600.0, journal_file_bytes=1 << 30, takeover=True)


async def _snapshot_while_open(tmp_path: Path, records: list[bytes]) -> Path:
    """Append records (PD) and copy the data dir while the store is open, so the copy
    is what a crash at that moment would leave: everything only in the journal."""
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create("seg")
        for record in records:
            await store.append("seg", record)
        snapshot = tmp_path / "snapshot"
        # (the metadata backup's snapshot file comes and goes: not part of the data dir's state)
        crash_copy(data, snapshot)
    return snapshot


async def test_journal_torn_at_many_offsets(tmp_path: Path) -> None:
    rng = random.Random(7)
    # every frame end is cut at -1, 0 and +1; 20 records of random lengths give every case
    records = [bytes([65 + i % 26]) * rng.randint(1, 200) for i in range(20)]
    snapshot = await _snapshot_while_open(tmp_path, records)
    (journal_file,) = [p for _, p in list_files(snapshot / "journal")]
    size = journal_file.stat().st_size
    # the segment's creation frame comes first (its metadata commit is in the copy too)
    position = size - sum(FRAME_OVERHEAD + len(record) for record in records)
    assert position > 0
    all_ends = [position]
    frame_ends = []
    for record in records:
        position += FRAME_OVERHEAD + len(record)
        frame_ends.append(position)
    all_ends += frame_ends
    assert frame_ends[-1] == size
    cuts = {0, size} | {e + d for e in all_ends for d in (-1, 0, 1) if 0 <= e + d <= size}
    cuts |= {rng.randrange(size) for _ in range(20)}
    for cut in sorted(cuts):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(snapshot, work)
        with open(work / "journal" / journal_file.name, "r+b") as f:
            f.truncate(cut)
        whole = sum(1 for e in frame_ends if e <= cut)
        async with open_store(small_config(work, **NO_FLUSH)) as store:
            data = await store.read("seg")
            assert data == b"".join(records[:whole]), f"cut at {cut}"
            report = store.statistics().recovery
            assert report is not None
            assert report.torn_bytes_cut == cut - max([0] + [e for e in all_ends if e <= cut])
            # the store keeps working after the cut, and the next restart agrees
            await store.append("seg", b"after")
        async with open_store(small_config(work, **NO_FLUSH)) as store:
            assert await store.read("seg") == b"".join(records[:whole]) + b"after"
        shutil.rmtree(work)


async def test_a_damaged_frame_before_intact_ones_is_corruption_and_repair_keeps_them(tmp_path: Path) -> None:
    """One flipped bit inside an acknowledged record with intact records after it is
    corruption, not a torn tail: the store refuses to open, naming the file and offset;
    ``repair_journal`` (fsck --repair) moves the damaged frame to lost+found, keeps the
    other segments' frames in place and saves the damaged segment's later frames."""
    records = [b"one", b"two", b"three", b"four"]
    data = tmp_path / "live"
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create("seg")
        await store.create("other")
        for record in records:
            await store.append("seg", record)
            await store.append("other", record.upper())
        snapshot = tmp_path / "snapshot"
        crash_copy(data, snapshot)
    (journal_file,) = [p for _, p in list_files(snapshot / "journal")]
    raw = bytearray(journal_file.read_bytes())
    frames = [len(record) for record in records for _ in (0, 1)]
    first_append = len(raw) - sum(FRAME_OVERHEAD + n for n in frames)  # after the creations
    damaged_at = first_append + sum(FRAME_OVERHEAD + n for n in frames[:2])  # seg's "two"
    raw[damaged_at + FRAME_OVERHEAD + 1] ^= 0x04
    journal_file.write_bytes(bytes(raw))
    with pytest.raises(JournalCorruptionError, match=f"{journal_file.name} is damaged at byte offset {damaged_at}"):
        async with open_store(small_config(snapshot, **NO_FLUSH)):
            pass
    with pytest.raises(JournalCorruptionError, match="fsck --repair"):  # and again: nothing was cut
        async with open_store(small_config(snapshot, **NO_FLUSH)):
            pass
    async with open_store(small_config(snapshot, repair_journal=True, **NO_FLUSH)) as store:
        assert await store.read("seg") == b"one"
        assert await store.read("other") == b"ONETWOTHREEFOUR"
        report = store.statistics().recovery
        assert report is not None and (report.damaged_stretches_moved, report.frames_moved) == (1, 2)
    saved = {e.path: e for e in lost_found_entries(snapshot)}
    damaged = saved[f"lost+found/journal/{journal_file.name}@{damaged_at}.damaged"]
    assert damaged.size == FRAME_OVERHEAD + 3 and damaged.description is not None
    after = next(e for p, e in saved.items() if p.startswith("lost+found/seg.journal-"))
    assert (snapshot / after.path).read_bytes() == b"threefour"
    assert after.description is not None and after.description["start_offset"] == 6
    assert after.description["missing_from_offset"] == 3
    async with open_store(small_config(snapshot, **NO_FLUSH)) as store:  # repaired for good
        assert await store.read("seg") == b"one"
        await store.append("seg", b"-on")
        assert await store.read("seg") == b"one-on"


async def test_a_bad_frame_followed_only_by_unsynced_frames_is_a_torn_tail(tmp_path: Path) -> None:
    """A power loss may write a later page before an earlier one: whole frames after a
    bad one that were queued before it was synced prove nothing, and are cut with it."""
    records = [b"one", b"two", b"three"]
    snapshot = await _snapshot_while_open(tmp_path, records)
    (journal_file,) = [p for _, p in list_files(snapshot / "journal")]
    raw = bytearray(journal_file.read_bytes())
    second = len(raw) - sum(FRAME_OVERHEAD + len(record) for record in records[1:])
    third = second + FRAME_OVERHEAD + len(records[1])
    # the third frame as if queued before the second was synced: its synced_lsn below it
    synced_lsn_at = third + 16 + 25
    lsn_of_second = second  # the only file starts at LSN 0
    struct.pack_into("<Q", raw, synced_lsn_at, lsn_of_second)
    header = struct.unpack_from("<IIQ", raw, third)
    payload = bytes(raw[third + 16:third + 16 + header[0]])
    struct.pack_into("<I", raw, third + 4, crc32c(payload, crc32c(struct.pack("<Q", header[2]))))
    raw[second + FRAME_OVERHEAD] ^= 0x01  # damage the second
    journal_file.write_bytes(bytes(raw))
    async with open_store(small_config(snapshot, **NO_FLUSH)) as store:
        assert await store.read("seg") == b"one"
        report = store.statistics().recovery
        assert report is not None and report.unsynced_frames_dropped == 1


async def test_replay_skips_flushed_bytes_and_deleted_segments(tmp_path: Path) -> None:
    data = tmp_path / "d"
    config = small_config(data, **NO_FLUSH)
    async with open_store(config) as store:
        await store.create("keep")
        await store.create("gone")
        await store.append("keep", b"flushed-")
        await store.append("gone", b"x" * 100)
        await store.flush("keep")
        await store.append("keep", b"journal")
        await store.delete("gone")
        crash_copy(data, tmp_path / "crash")
    async with open_store(small_config(tmp_path / "crash", **NO_FLUSH)) as store:
        assert await store.read("keep") == b"flushed-journal"
        info = await store.stat("keep")
        assert info.flushed_length == len(b"flushed-")
        with pytest.raises(SegmentNotFoundError):
            await store.stat("gone")
        report = store.statistics().recovery
        assert report is not None and report.frames_skipped == 2


async def test_bytes_beyond_a_committed_chunk_length_are_ignored(tmp_path: Path) -> None:
    data = tmp_path / "d"
    async with open_store(small_config(data)) as store:
        await store.create("c")
        await store.append("c", b"committed")
        await store.flush("c")
        (chunk,) = await store.chunk_layout("c")
    chunk_path = data / "chunks" / chunk["name"]
    with open(chunk_path, "ab") as f:
        f.write(b"GARBAGE-FROM-AN-UNCOMMITTED-WRITE")
    async with open_store(small_config(data)) as store:
        assert await store.read("c") == b"committed"
        await store.append("c", b"+more")
        await store.flush("c")
        assert await store.read("c") == b"committed+more"
        layout = await store.chunk_layout("c")
        assert len(layout) == 2 and layout[1]["epoch"] == store.epoch
