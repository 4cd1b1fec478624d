"""Journal framing, group commit, rolling and the recovery scan."""

from pathlib import Path

import trio

from tierfs.engine.journal import Journal
from tierfs.engine.journal_format import FRAME_OVERHEAD, ScanResult, encode_append, list_files
from tierfs.engine.journal_scan import scan


def _scan(directory: Path) -> tuple[list, ScanResult]:
    result = ScanResult(end_lsn=0, next_seq=1)
    frames = list(scan(list_files(directory), 1 << 20, result))
    return frames, result


def test_frame_roundtrip(tmp_path: Path) -> None:
    frame = encode_append(7, 3, 100, b"hello")
    assert len(frame) == FRAME_OVERHEAD + 5
    (tmp_path / "00000000000000000000.jnl").write_bytes(frame + encode_append(8, 3, 105, b"!"))
    frames, result = _scan(tmp_path)
    assert [(f.seq, f.segment_id, f.offset, f.data) for f in frames] == [
        (7, 3, 100, b"hello"),
        (8, 3, 105, b"!"),
    ]
    assert result.next_seq == 9 and result.cut is None
    assert result.end_lsn == 2 * FRAME_OVERHEAD + 6


def test_scan_stops_at_crc_damage_and_sequence_break(tmp_path: Path) -> None:
    good = encode_append(1, 1, 0, b"aaaa")
    bad = bytearray(encode_append(2, 1, 4, b"bbbb"))
    bad[-1] ^= 0xFF
    path = tmp_path / "00000000000000000000.jnl"
    path.write_bytes(good + bytes(bad) + encode_append(3, 1, 8, b"cccc"))
    frames, result = _scan(tmp_path)
    assert [f.data for f in frames] == [b"aaaa"]
    assert result.cut == (path, len(good))
    path.write_bytes(good + encode_append(5, 1, 4, b"bbbb"))  # seq jumps from 1 to 5
    frames, result = _scan(tmp_path)
    assert [f.data for f in frames] == [b"aaaa"]


def test_scan_drops_files_after_a_torn_one(tmp_path: Path) -> None:
    first = encode_append(1, 1, 0, b"aaaa")
    (tmp_path / "00000000000000000000.jnl").write_bytes(first + b"\x01\x02")
    later = tmp_path / f"{len(first) + 2:020d}.jnl"
    later.write_bytes(encode_append(2, 1, 4, b"bbbb"))
    frames, result = _scan(tmp_path)
    assert [f.data for f in frames] == [b"aaaa"]
    assert result.dropped_files == [later]


def _journal(directory: Path, on_durable=lambda lsn: None, **settings: float) -> Journal:  # type: ignore[no-untyped-def]
    values = dict(file_bytes=1 << 20, vd_sync_interval_s=1.0)
    values.update(settings)
    return Journal(directory, start_lsn=0, next_seq=1, on_durable=on_durable, **values)  # type: ignore[arg-type]


async def test_group_commit_batches_concurrent_appends(tmp_path: Path) -> None:
    durable: list[int] = []
    journal = _journal(tmp_path, durable.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)

        async def writer(i: int) -> None:
            _, end = journal.add_append(1, i, b"x")
            await journal.wait_durable(end)

        async with trio.open_nursery() as writers:
            for i in range(64):
                writers.start_soon(writer, i)
        nursery.cancel_scope.cancel()
    await journal.close()
    assert journal.durable_lsn == 64 * (FRAME_OVERHEAD + 1)
    assert journal.syncs < 64 / 4, f"{journal.syncs} fdatasyncs for 64 appends: no batching"
    assert durable[-1] == journal.durable_lsn


async def test_rolls_files_and_reads_back(tmp_path: Path) -> None:
    journal = _journal(tmp_path, file_bytes=100)
    positions = []
    for i in range(10):
        positions.append(journal.add_append(1, i * 50, bytes([i]) * 50))
        journal.write_queued()
    assert journal.file_count() > 3
    for i, (frame_lsn, _) in enumerate(positions):
        assert journal.read_at(frame_lsn + FRAME_OVERHEAD, 50) == bytes([i]) * 50
    deletable = journal.deletable_files(positions[5][0])
    assert deletable and all(p.exists() for p in deletable)
    await journal.close()
    frames, _ = _scan(tmp_path)
    assert [f.offset for f in frames] == [i * 50 for i in range(10)]


async def test_vd_writes_are_synced_within_the_interval(tmp_path: Path) -> None:
    synced: list[int] = []
    journal = _journal(tmp_path, synced.append, vd_sync_interval_s=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.add_append(1, 0, b"v")
        journal.write_queued()
        assert journal.durable_lsn == 0
        with trio.fail_after(2):
            while not synced:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await journal.close()
    assert synced == [FRAME_OVERHEAD + 1]
