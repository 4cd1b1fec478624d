"""Packs: on an object store the storage writer puts the small new chunks of a batch
into one object ``packs/e<epoch>-<UUID>`` (each chunk record has its ``object_offset``
there). Read back through the engine, the direct (fsspec) reader and after a restart;
a pack stays while any chunk record, or a chunk's hold (defrag's deletion lag), refers
to it and the orphan sweep deletes it after; defrag and offload of packed chunks; a
kill -9 between the pack's PUT and its commit leaves an orphan that gc deletes; fsck
stays clean. Real S3 (moto server), in process and through the daemon."""

from __future__ import annotations

import contextlib
import io
import signal
from pathlib import Path
from typing import Any

import boto3
import pytest
import trio

from tierfs import open_store
from tierfs.contracts.config import StoreConfig
from tierfs.contracts.reports.gc import TIER2
from tierfs.engine.backup.transfer import export_metadata, import_metadata
from tierfs.engine.object_keys import is_pack_name
from tierfs.remote.direct_read import DirectChunkReader, SegmentLayout
from tierfs.store.facade import SegmentStore
from tierfs.testing.crash import FLUSH_CHUNK_WRITTEN, crash_environment, wait_for_crash
from tierfs.testing.harness import small_config, start_daemon

FILES = 40
HOUR_S = 3600.0


def content(index: int, size: int = 700) -> bytes:
    return bytes((index * 31 + i) % 251 for i in range(size))


@pytest.fixture
def s3(s3_bucket: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    url, options = s3_bucket
    bucket = url.split("/")[2]
    return {"bucket": bucket, "tier2": url, "longterm": f"s3://{bucket}/longterm", "options": options,
            "endpoint": str(options["endpoint_url"])}


def _config(data_dir: Path, s3: dict[str, Any], **overrides: Any) -> StoreConfig:
    values: dict[str, Any] = dict(
        tier2_url=s3["tier2"], tier2_options=s3["options"],
        flush_interval_s=HOUR_S, orphan_grace_s=0, orphan_gc_interval_s=0, policy_interval_s=HOUR_S,
        defrag_interval_s=HOUR_S,
    )
    values.update(overrides)
    return small_config(data_dir, **values)


def _chunk_keys(s3: dict[str, Any]) -> list[str]:
    """Chunk and pack objects in the bucket (no owner claims, no metadata backups)."""
    client = boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=s3["bucket"], Prefix="chunks/")
    keys = (o["Key"][len("chunks/"):] for o in listed.get("Contents", []))
    return sorted(k for k in keys if not k.startswith(("_owner/", "_metadata/")))


async def _create_small_files(store: SegmentStore, names: list[str], size: int = 700) -> None:
    for index, name in enumerate(names):
        await store.create(name, make_parents=True)
        await store.append(name, content(index, size))


async def _layouts(store: SegmentStore, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {name: await store.chunk_layout(name) for name in names}


async def test_small_files_share_one_pack_and_read_back_everywhere(tmp_path: Path, s3: dict[str, Any]) -> None:
    names = [f"small/f{i:03d}" for i in range(FILES)]
    config = _config(tmp_path / "data", s3)
    async with open_store(config) as store:
        await _create_small_files(store, names)
        await store.flush()
        assert store.writer.packs == 1
        layouts = await _layouts(store, names)
        packs = {c["name"] for layout in layouts.values() for c in layout}
        assert len(packs) == 1 and is_pack_name(next(iter(packs)))
        (pack,) = packs
        assert pack.startswith("packs/e000001-")
        offsets = sorted(layout[0]["object_offset"] for layout in layouts.values())
        assert offsets == [i * 700 for i in range(FILES)], "each chunk at its own place"
        assert _chunk_keys(s3) == [pack], "one PUT for all of them"
        store.block_cache.clear()
        for index, name in enumerate(names):
            assert await store.read(name) == content(index)
            assert await store.read(name, 100, 50) == content(index)[100:150]
        # the direct reader (what the fsspec plugin uses) reads each chunk at its place
        reader = DirectChunkReader(dict(s3["options"]))
        for index, name in enumerate(names):
            segment = SegmentLayout.from_json(layouts[name])
            assert segment.chunks[0].object_offset == layouts[name][0]["object_offset"]
            assert reader.read(segment, 0, 700) == content(index)
            assert reader.read(segment, 5, 9) == content(index)[5:9]
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []
        # a second batch for the same files: new chunks in a new pack (a pack never grows)
        for index, name in enumerate(names):
            await store.append(name, content(index + 1))
        await store.flush()
        assert store.writer.packs == 2
    async with open_store(config) as store:  # a restart: read from the metadata and S3 alone
        for index, name in enumerate(names):
            assert await store.read(name) == content(index) + content(index + 1)
        assert len(_chunk_keys(s3)) == 2
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []


async def test_metadata_export_and_import_carry_the_places_in_packs(tmp_path: Path, s3: dict[str, Any]) -> None:
    names = [f"x/f{i}" for i in range(4)]
    source = _config(tmp_path / "data", s3)
    async with open_store(source) as store:
        await _create_small_files(store, names)
        await store.flush()
        layouts = await _layouts(store, names)
    assert len({layout[0]["object_offset"] for layout in layouts.values()}) == len(names)
    exported = io.BytesIO()
    export_metadata(source.data_dir / "metadata.sqlite", exported)
    target = tmp_path / "moved"
    import_metadata(target, io.BytesIO(exported.getvalue()))
    async with open_store(_config(target, s3, takeover=True)) as store:  # the source's owner is gone
        for index, name in enumerate(names):
            moved = await store.chunk_layout(name)
            assert [(c["name"], c["object_offset"]) for c in moved] == [
                (c["name"], c["object_offset"]) for c in layouts[name]]
            assert await store.read(name) == content(index)
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []


async def test_a_pack_stays_until_its_last_chunk_goes_then_gc_deletes_it(tmp_path: Path, s3: dict[str, Any]) -> None:
    names = [f"d/f{i}" for i in range(6)]
    async with open_store(_config(tmp_path / "data", s3)) as store:
        await _create_small_files(store, names)
        await store.flush()
        (pack,) = _chunk_keys(s3)
        for name in names[:5]:
            await store.delete(name)
        await store.garbage.collect()
        assert (await store.gc()).orphans == []
        assert _chunk_keys(s3) == [pack], "the last file still reads from it"
        store.block_cache.clear()
        assert await store.read(names[5]) == content(5)
        assert (await store.fsck()).problems == []
        await store.delete(names[5])
        await store.garbage.collect()
        assert (await store.fsck()).orphans and _chunk_keys(s3) == [pack]
        report = await store.gc()
        assert [(o.store, o.name) for o in report.orphans] == [(TIER2, pack)]
        assert _chunk_keys(s3) == []
        assert (await store.fsck()).orphans == []


async def test_retention_and_a_replacing_rename_release_packed_chunks(tmp_path: Path, s3: dict[str, Any]) -> None:
    async with open_store(_config(tmp_path / "data", s3)) as store:
        await _create_small_files(store, ["r/a", "r/b"])
        await store.flush()
        (pack,) = _chunk_keys(s3)
        await store.rename("r/a", "r/b")  # replaces r/b: its chunk leaves the pack, r/a's stays
        await store.garbage.collect()
        assert (await store.gc()).orphans == [] and _chunk_keys(s3) == [pack]
        store.block_cache.clear()
        assert await store.read("r/b") == content(0)
        await store.delete("r/b")
        await store.garbage.collect()
        assert [o.name for o in (await store.gc()).orphans] == [pack]


async def test_defrag_of_packed_chunks_keeps_the_packs_for_the_deletion_lag(tmp_path: Path, s3: dict[str, Any]) -> None:
    lag_s = 1.0
    async with open_store(_config(tmp_path / "data", s3, offload_deletion_lag_s=lag_s)) as store:
        expected = b""
        for round_ in range(3):  # three batches: the segment's chunks in three packs
            await _create_small_files(store, [f"other/r{round_}"])
            if round_ == 0:
                await store.create("logs/s", make_parents=True)
            await store.append("logs/s", content(round_))
            expected += content(round_)
            await store.flush()
        packs = _chunk_keys(s3)
        assert len(packs) == 3 and all(is_pack_name(k) for k in packs)
        for round_ in range(3):
            await store.delete(f"other/r{round_}")
        await store.seal("logs/s")
        await store.flush()
        result = await store.defrag("logs/s")
        assert result["runs_merged"] == 1 and result["chunks_after"] == 1
        (merged,) = await store.chunk_layout("logs/s")
        assert not is_pack_name(merged["name"]) and merged["object_offset"] == 0
        store.block_cache.clear()
        assert await store.read("logs/s") == expected
        # a reader holding the old chunk list may read the packs until the lag passed
        await store.garbage.collect()
        assert (await store.gc()).orphans == []
        assert set(packs) <= set(_chunk_keys(s3))
        await trio.sleep(lag_s + 0.2)
        await store.garbage.collect()
        assert sorted(o.name for o in (await store.gc()).orphans) == packs
        assert _chunk_keys(s3) == [merged["name"]]
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []


async def test_offload_of_a_packed_chunk_leaves_the_pack_to_its_other_chunks(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    config = _config(tmp_path / "data", s3, offload_url=s3["longterm"], offload_options=s3["options"],
                     offload_deletion_lag_s=0.0)
    async with open_store(config) as store:
        await _create_small_files(store, ["o/cold", "o/hot"])
        await store.seal("o/cold")
        await store.flush()
        (pack,) = _chunk_keys(s3)
        await store.offload("o/cold")
        with trio.fail_after(30):
            while (await store.offload_status("o/cold"))["state"] == "RUNNING":
                await trio.sleep(0.02)
        with trio.fail_after(30):  # the hot copy is released (lag 0): the pack is not deleted
            while not all(c.offload_hot_deleted for c in await store.chunks_of(store._segment("o/cold"))):
                await trio.sleep(0.02)
        assert _chunk_keys(s3) == [pack]
        store.block_cache.clear()
        assert await store.read("o/cold") == content(0)
        assert await store.read("o/hot") == content(1)
        assert (await store.gc()).orphans == []
        report = await store.fsck()
        assert report.problems == [] and report.orphans == []
        await store.delete("o/hot")  # the pack's last reference in the chunk store
        await store.garbage.collect()
        assert [o.name for o in (await store.gc()).orphans] == [pack]
        store.block_cache.clear()
        assert await store.read("o/cold") == content(0), "read from the long-term store"


def test_kill_9_after_the_pack_put_leaves_an_orphan_that_gc_deletes(tmp_path: Path, s3: dict[str, Any]) -> None:
    data_dir = tmp_path / "data"
    env = {"TIERFS_TIER2": s3["tier2"], "TIERFS_TIER2_ENDPOINT_URL": s3["endpoint"],
           "TIERFS_FLUSH_INTERVAL_S": "3600", **crash_environment(FLUSH_CHUNK_WRITTEN)}
    daemon = start_daemon(data_dir, env=env)
    client = daemon.client()
    names = [f"c/f{i}" for i in range(5)]
    for index, name in enumerate(names):
        client.create(name, parents=True)
        client.append(name, content(index))
    with contextlib.suppress(Exception):  # the connection dies with the daemon
        client.op("flush")  # one batch: the daemon dies after the pack's PUT, before the commit
    code, stderr = wait_for_crash(daemon, timeout_s=30)
    client.close()
    assert code == -signal.SIGKILL, stderr[-2000:]
    (orphan,) = _chunk_keys(s3)
    assert orphan.startswith("packs/e000001-")

    async def recover() -> None:
        async with open_store(_config(data_dir, s3)) as store:
            await store.flush()  # the journal's bytes, flushed again in a new pack
            for index, name in enumerate(names):
                assert await store.read(name) == content(index)
            report = await store.fsck()
            assert report.problems == []
            assert [(o.store, o.name) for o in report.orphans] == [(TIER2, orphan)]
            assert [o.name for o in (await store.gc()).orphans] == [orphan]
            (pack,) = _chunk_keys(s3)
            assert pack.startswith("packs/e000002-")
            store.block_cache.clear()
            for index, name in enumerate(names):
                assert await store.read(name) == content(index)
            assert (await store.fsck()).orphans == []

    trio.run(recover)


async def test_a_pack_being_committed_is_never_swept(tmp_path: Path, s3: dict[str, Any]) -> None:
    """A sweep between the pack's PUT and its commit keeps it (``packs_in_flight``)."""
    async with open_store(_config(tmp_path / "data", s3)) as store:
        flusher = store.writer._flusher  # the commit is held to sweep meanwhile
        commit = store.catalogue.commit_flushes
        swept: list[Any] = []

        async def sweep_then_commit(*args: Any, **kwargs: Any) -> Any:
            assert flusher.packs_in_flight
            swept.append(await store.gc())
            return await commit(*args, **kwargs)

        store.catalogue.commit_flushes = sweep_then_commit  # type: ignore[method-assign]
        await _create_small_files(store, ["p/a", "p/b"])
        await store.flush()
        assert swept and swept[0].orphans == [] and swept[0].kept_in_flight == 1
        assert not flusher.packs_in_flight
        store.block_cache.clear()
        assert await store.read("p/a") == content(0)
        assert len(_chunk_keys(s3)) == 1 and (await store.gc()).orphans == []


async def test_local_tier2_grows_chunks_instead_of_packing(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "data", flush_interval_s=HOUR_S)) as store:
        assert store.chunk_storage.supports_append
        for name in ("l/a", "l/b", "l/c"):
            await store.create(name, make_parents=True)
            await store.append(name, b"x" * 100)
        await store.flush()
        for name in ("l/a", "l/b", "l/c"):
            await store.append(name, b"y" * 100)
        await store.flush()
        assert store.writer.packs == 0
        for name in ("l/a", "l/b", "l/c"):
            assert len(await store.chunk_layout(name)) == 1, "the chunk grew in place"
            assert await store.read(name) == b"x" * 100 + b"y" * 100


def _assert_contiguous(name: str, layout: list[dict[str, Any]], flushed_length: int) -> None:
    """Chunks from 0 to ``flushed_length``, each starting where the one before ends."""
    position = 0
    for entry in layout:
        assert entry["start"] == position, f"{name}: a chunk starts at {entry['start']}, bytes end at {position}"
        position = entry["end"]
    assert position == flushed_length, f"{name}: chunks end at {position}, flushed length {flushed_length}"


async def test_interleaved_batches_flushes_and_defrag_keep_every_chunk_list_contiguous(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    """Segments of every durability level appended to concurrently while the storage
    writer batches them (early joins included), flush() requests them all, single
    segments are flushed and defragmented meanwhile: every segment's chunk list, in
    memory and in the metadata after a restart, covers its flushed bytes exactly, and
    every byte reads back through the engine and the direct reader."""
    names = [f"mix/{level}-{i}" for i in range(3) for level in ("pd", "vd", "tier2")]
    config = _config(tmp_path / "data", s3, flush_interval_s=0.05, defrag_min_small_chunks=2)
    written = {name: bytearray() for name in names}
    async with open_store(config) as store:
        for name in names:
            await store.create(name, make_parents=True, durability=name.split("/")[1].split("-")[0])

        async def appends(index: int, name: str) -> None:
            for number in range(60):
                record = b"%s-%04d|" % (name.encode(), number) * (1 + (number * 7 + index) % 5)
                await store.append(name, record)
                written[name] += record
                if number % 11 == index % 11:
                    await trio.sleep(0.01)

        merged_runs = 0

        async def interferences() -> None:
            nonlocal merged_runs
            for round_number in range(8):
                await trio.sleep(0.03)
                await store.flush(names[round_number % len(names)])
                merged_runs += (await store.defrag(names[(round_number * 5) % len(names)]))["runs_merged"]
                if round_number % 3 == 0:
                    await store.flush()

        async with trio.open_nursery() as nursery:
            for index, name in enumerate(names):
                nursery.start_soon(appends, index, name)
            nursery.start_soon(interferences)
        await store.flush()
        packed = 0
        for name in names:
            layout = await store.chunk_layout(name)
            _assert_contiguous(name, layout, len(written[name]))
            packed += sum(is_pack_name(entry["name"]) for entry in layout)
            assert await store.read(name) == bytes(written[name])
        assert packed, "the batches put chunks into packs"
        assert merged_runs, "defrag merged runs of packed chunks meanwhile"
    async with open_store(config) as store:  # the committed lists, loaded from the metadata
        reader = DirectChunkReader(dict(s3["options"]))
        for name in names:
            layout = await store.chunk_layout(name)
            _assert_contiguous(name, layout, len(written[name]))
            assert reader.read(SegmentLayout.from_json(layout), 0, len(written[name])) == bytes(written[name])
            assert await store.read(name) == bytes(written[name])
