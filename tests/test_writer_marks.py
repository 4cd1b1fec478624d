"""Exactly-once by identity in the engine: an append sent again with its writer
identity is answered with its offset, before and after a restart (from the journal's
frames, and from the segment record once flushed), never appended twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts.errors import AlreadyAppendedError, BadOffsetError, SegmentSealedError
from tierfs.contracts.writers import Writer, WriterSeq
from tierfs.engine.record_types import SegmentMeta
from tierfs.engine.segments.writer_marks import MARKS_PER_WRITER, PERSISTED_WRITERS, WriterMarks
from tierfs.testing.harness import crash_copy, small_config

NO_FLUSH = dict(flush_bytes=1 << 30, flush_interval_s=3600.0)


async def test_a_resent_append_is_answered_with_its_offset(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d", **NO_FLUSH)) as store:
        await store.create("s")
        writer = Writer()
        first, second = writer.next(), writer.next()
        assert await store.append("s", b"one", writer=first) == 0
        assert await store.append("s", b"two", writer=second) == 3
        assert await store.append("s", b"two", expected_offset=0, writer=second) == 3  # before the offset check
        with pytest.raises(AlreadyAppendedError):  # older than the writer's last: it landed before it
            await store.append("s", b"zzz", writer=WriterSeq(writer.writer, 0))
        assert await store.append("s", b"one", writer=first) == 0
        await store.seal("s")
        assert await store.append("s", b"two", writer=second) == 3  # it landed before the seal
        with pytest.raises(SegmentSealedError):
            await store.append("s", b"new", writer=writer.next())
        assert await store.read("s") == b"onetwo"


async def test_marks_survive_a_crash_and_a_flush(tmp_path: Path) -> None:
    data = tmp_path / "d"
    writer = Writer()
    identities = [writer.next() for _ in range(3)]
    async with open_store(small_config(data, **NO_FLUSH)) as store:
        await store.create("journal-only")
        await store.create("flushed")
        await store.append("journal-only", b"a", writer=identities[0])
        await store.append("flushed", b"b", writer=identities[1])
        await store.flush("flushed")
        await store.append("journal-only", b"c", writer=identities[2])
        crash = tmp_path / "crash"
        crash_copy(data, crash)
    for directory in (crash, data):  # after a kill -9 (the copy) and after a clean stop
        async with open_store(small_config(directory, takeover=True, **NO_FLUSH)) as store:
            assert await store.append("journal-only", b"a", writer=identities[0]) == 0
            assert await store.append("flushed", b"b", expected_offset=1, writer=identities[1]) == 0
            assert await store.append("journal-only", b"c", writer=identities[2]) == 1
            with pytest.raises(BadOffsetError):
                await store.append("flushed", b"b", expected_offset=0)  # anonymous: a new append
            assert await store.read("journal-only") == b"ac" and await store.read("flushed") == b"b"


def test_marks_are_bounded_and_persist_only_flushed_appends() -> None:
    marks = WriterMarks()
    for seq in range(1, 10):
        marks.record(7, seq, seq * 10, 10, 0)
    assert marks.find(7, 9) is not None and marks.find(7, 9 - MARKS_PER_WRITER) is None
    for writer in range(100, 100 + PERSISTED_WRITERS + 5):
        marks.record(writer, 1, 1000 + writer, 1, 0)
    record = marks.persisted(SegmentMeta(), flushed_end=95)
    assert record.append_writers == (7,) and record.append_writer_seqs == (8,)  # 9 ends at 100
    record = marks.persisted(SegmentMeta(), flushed_end=10_000)
    assert len(record.append_writers) == PERSISTED_WRITERS and 7 not in record.append_writers
    again = WriterMarks.from_record(record)
    assert again.find(record.append_writers[-1], 1) is not None
