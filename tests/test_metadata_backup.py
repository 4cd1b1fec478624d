"""Metadata survives the loss of the data dir: continuous backups into tier-2's
``_metadata/``, ``tierfs restore`` from tier-2 alone, ``tierfs metadata export|import``.

Real parts throughout: a ``tierfs serve`` daemon killed with SIGKILL, the ``tierfs``
command in subprocesses, local tier-2 directories and moto's S3 server."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import (
    MetadataFormatError,
    NoMetadataBackupError,
    StoreNotEmptyError,
    Tier2Error,
)
from tierfs.engine.backup import metadata_backup
from tierfs.engine.backup.objects import KEEP_BACKUPS, BackupObjects, LogObject
from tierfs.engine.backup.restore import restore_metadata
from tierfs.engine.backup.transfer import export_metadata, import_metadata
from tierfs.store.datadir.restore import restore_store
from tierfs.testing.harness import small_config, start_daemon

KiB = 1 << 10


def tierfs(data_dir: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
                          input=stdin, capture_output=True, timeout=120)


def _payloads(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {
        "logs/a.log": rng.randbytes(700 * KiB),  # several chunks
        "logs/b.log": b"".join(b"line %d\n" % i for i in range(5000)),
        "c.bin": rng.randbytes(3),
        "empty": b"",
    }


def test_restore_after_kill_9_and_losing_the_data_dir(tmp_path: Path) -> None:
    data_dir, tier2 = tmp_path / "data", str(tmp_path / "tier2")
    payloads = _payloads(1)
    daemon = start_daemon(data_dir, env={"TIERFS_TIER2": tier2, "TIERFS_FLUSH_INTERVAL_S": "0.2",
                                         "TIERFS_MAX_CHUNK_BYTES": str(256 * KiB)})
    try:
        client = daemon.client()
        try:
            for name, data in payloads.items():
                client.create(name, parents=True)
                for start in range(0, len(data), 64 * KiB):
                    client.append(name, data[start:start + 64 * KiB])
            client.op("seal", path="c.bin")
            client.op("flush")  # returns once the metadata changes are on tier-2 too
            old_epoch = BackupObjects(tier2).manifests()[0].epoch
            assert daemon.metrics()["tierfs_metadata_backups_total"] >= 1
        finally:
            client.close()
    finally:
        daemon.kill9()
    shutil.rmtree(data_dir)  # the disk is gone; tier-2 is all there is

    new_dir = tmp_path / "restored"
    done = tierfs(new_dir, "restore", "--tier2", tier2)
    assert done.returncode == 0, done.stderr.decode() + done.stdout.decode()
    assert b"restored 4 segments" in done.stdout and b"OK" in done.stdout
    backups = BackupObjects(tier2).manifests()
    newest_epoch = backups[0].epoch
    assert newest_epoch > old_epoch  # the restored store is a new owner
    for name, data in payloads.items():
        read = tierfs(new_dir, "--tier2", tier2, "cat", name)
        assert read.returncode == 0 and read.stdout == data, name
    stat = json.loads(tierfs(new_dir, "--tier2", tier2, "stat", "c.bin", "--json").stdout)
    assert stat["sealed"]
    fsck = tierfs(new_dir, "--tier2", tier2, "fsck")
    assert fsck.returncode == 0 and b"OK" in fsck.stdout
    appended = tierfs(new_dir, "--tier2", tier2, "append", "logs/b.log", "more\n")
    assert appended.returncode == 0 and int(appended.stdout) == len(payloads["logs/b.log"])


async def _write_and_flush(config: Any, payloads: dict[str, bytes]) -> int:
    async with open_store(config) as store:
        for name, data in payloads.items():
            await store.create(name, make_parents=True)
            for start in range(0, len(data), 64 * KiB):
                await store.append(name, data[start:start + 64 * KiB])
        await store.flush()
        return store.epoch


async def _read_all(config: Any, names: list[str]) -> tuple[dict[str, bytes], int, list[Any]]:
    async with open_store(config) as store:
        contents = {name: await store.read(name) for name in names}
        return contents, store.epoch, (await store.fsck()).problems


async def test_garbage_metadata_file_is_restored_from_tier2(tmp_path: Path) -> None:
    tier2 = str(tmp_path / "tier2")
    config = small_config(tmp_path / "data", tier2_url=tier2)
    payloads = _payloads(2)
    first_epoch = await _write_and_flush(config, payloads)  # closing takes a last backup
    metadata = config.data_dir / "metadata.sqlite"
    metadata.write_bytes(os.urandom(64 * KiB))  # the disk scribbled over it
    for suffix in ("-wal", "-shm"):
        (config.data_dir / f"metadata.sqlite{suffix}").unlink(missing_ok=True)

    # a later owner wrote a chunk but died before its first backup: its epoch counts too
    later = min(Path(tier2).glob("s*")) / f"e{first_epoch + 5:06d}-c00000001"
    later.write_bytes(b"written by an owner no backup knows")

    report = await restore_store(config)
    assert report.segments == len(payloads) and not report.fsck.problems
    assert report.epoch > first_epoch + 5
    assert any(name.startswith("metadata.sqlite.before-restore-") for name in report.set_aside)
    assert (config.data_dir / "journal").is_dir()  # kept, and replayed
    contents, epoch, problems = await _read_all(config, list(payloads))
    assert contents == payloads and not problems and epoch > report.epoch


async def test_restore_refuses_live_metadata_and_an_empty_tier2(tmp_path: Path) -> None:
    tier2 = str(tmp_path / "tier2")
    config = small_config(tmp_path / "data", tier2_url=tier2)
    with pytest.raises(NoMetadataBackupError):
        restore_metadata(tmp_path / "elsewhere", tier2)
    await _write_and_flush(config, {"x": b"x" * 10})
    before = (config.data_dir / "metadata.sqlite").read_bytes()
    with pytest.raises(StoreNotEmptyError):
        restore_metadata(config.data_dir, tier2)
    assert (config.data_dir / "metadata.sqlite").read_bytes() == before


async def test_backups_only_on_change_pruned_and_a_torn_newest_is_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_backup, "SNAPSHOT_AFTER_CHANGES", 1)  # a snapshot for every change
    tier2 = str(tmp_path / "tier2")
    config = small_config(tmp_path / "data", tier2_url=tier2)
    async with open_store(config) as store:
        backup = store.metadata_backup
        await backup.cycle()  # whatever the start-up cycle has not covered yet
        taken = backup.backups_taken
        assert not await backup.cycle()  # nothing changed: nothing uploaded
        assert backup.backups_taken == taken
        for i in range(KEEP_BACKUPS + 2):
            await store.create(f"s{i}")
            assert await backup.cycle()
        objects = BackupObjects(tier2)
        assert len(objects.manifests()) == KEEP_BACKUPS
        assert len([n for n in objects.names() if not n.endswith(".lineage")]) == 2 * KEEP_BACKUPS
        assert not [n for n in store.chunk_storage.list() if not n.startswith(("s", "_metadata/"))]
    newest = objects.manifests()[0]
    snapshot = Path(tier2) / "_metadata" / f"{newest.stem}.sqlite"
    snapshot.write_bytes(snapshot.read_bytes()[:-100])  # torn upload of the newest
    restored = restore_metadata(tmp_path / "new", tier2)
    assert restored.manifest.seq < newest.seq and restored.manifest.epoch == newest.epoch


def _block_uploads(folder: Path, aside: Path) -> None:
    """``folder`` moved to ``aside`` and a file put in its place: uploads into it fail.
    An upload already running in a worker thread may make the folder again in between:
    what it wrote goes aside too, and the file is tried again."""
    folder.rename(aside)
    while True:
        try:
            folder.write_bytes(b"not a folder")
            return
        except IsADirectoryError:
            with contextlib.suppress(OSError):  # it may still be writing: the next round takes the rest
                for path in folder.iterdir():
                    path.rename(aside / path.name)
                folder.rmdir()


async def test_a_failing_tier2_never_blocks_appends_and_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_backup, "SNAPSHOT_AFTER_CHANGES", 1)  # a snapshot for every change
    tier2 = tmp_path / "tier2"
    config = small_config(tmp_path / "data", tier2_url=str(tier2))
    async with open_store(config) as store:
        backup = store.metadata_backup
        await backup.cycle()
        failures = backup.failures
        _block_uploads(tier2 / "_metadata", tmp_path / "aside")
        await store.create("a")
        with trio.fail_after(5):
            await store.append("a", b"still appending")
        assert not await backup.cycle() and backup.failures > failures
        assert store.statistics().metadata_backup_failures == backup.failures
        (tier2 / "_metadata").unlink()
        (tmp_path / "aside").rename(tier2 / "_metadata")
        assert await backup.cycle()  # the pending change goes up now
    restored = restore_metadata(tmp_path / "new", str(tier2))
    assert restored.segments == 1


async def test_export_import_into_a_fresh_data_dir(tmp_path: Path) -> None:
    tier2 = str(tmp_path / "tier2")
    source = small_config(tmp_path / "data", tier2_url=tier2)
    payloads = _payloads(3)
    await _write_and_flush(source, payloads)
    async with open_store(source) as store:
        await store.mkdir("empty-dir")
        deleted_id = (await store.stat("empty")).segment_id  # type: ignore[union-attr]
        await store.delete("empty")  # import must not reuse its id, nor a directory's
        highest_id = max(deleted_id, (await store.stat("empty-dir")).directory_id)  # type: ignore[union-attr]

    exported = tmp_path / "meta.jsonl"
    done = tierfs(source.data_dir, "metadata", "export", str(exported))
    assert done.returncode == 0, done.stderr
    header = json.loads(exported.read_bytes().splitlines()[0])
    assert header["format"] == "tierfs-metadata" and header["version"] == 1

    # the moved store owns the same tier-2 from now on: it takes it over from the source
    target = source.replace(data_dir=tmp_path / "moved", takeover=True)
    done = tierfs(target.data_dir, "metadata", "import", "-", stdin=exported.read_bytes())
    assert done.returncode == 0, done.stderr
    expected = {k: v for k, v in payloads.items() if k != "empty"}
    contents, _, problems = await _read_all(target, list(expected))
    assert contents == expected and not problems
    async with open_store(target) as store:
        assert sorted(i.name for i in await store.list("")) == ["c.bin", "empty-dir", "logs"]
        new = await store.create("new")
        assert new.segment_id > highest_id  # not the deleted segment's id
    again = tierfs(target.data_dir, "metadata", "import", str(exported))
    assert again.returncode == 1 and b"empty store" in again.stderr  # not empty any more


@pytest.mark.parametrize("damage", ["header", "version", "truncated", "record", "orphan chunk"])
async def test_bad_import_input_is_refused_and_changes_nothing(tmp_path: Path, damage: str) -> None:
    source = small_config(tmp_path / "data", tier2_url=str(tmp_path / "tier2"))
    await _write_and_flush(source, {"a/b": b"abc" * 1000})
    out = io.BytesIO()
    export_metadata(source.data_dir / "metadata.sqlite", out)
    lines = out.getvalue().splitlines(keepends=True)
    if damage == "header":
        lines[0] = b'{"format": "something-else", "version": 1}\n'
    elif damage == "version":
        lines[0] = b'{"format": "tierfs-metadata", "version": 2}\n'
    elif damage == "truncated":
        lines = lines[:-1]
    elif damage == "record":
        index = next(i for i, line in enumerate(lines) if b'"segments"' in line and b'"id"' in line)
        row = json.loads(lines[index])
        row["value"] = "AAAA" + row["value"][4:]
        lines[index] = json.dumps(row).encode() + b"\n"
    else:
        lines = [line for line in lines if b'"table": "segments"' not in line]
        lines[-1] = json.dumps({"end": True, "rows": len(lines) - 3}).encode() + b"\n"
    target = source.data_dir.parent / "target"
    target_config = small_config(target, tier2_url=str(tmp_path / "tier2-target"))
    async with open_store(target_config):
        pass
    before = (target / "metadata.sqlite").read_bytes()
    with pytest.raises(MetadataFormatError):
        import_metadata(target, io.BytesIO(b"".join(lines)))
    assert (target / "metadata.sqlite").read_bytes() == before
    contents, _, _ = await _read_all(target_config, [])
    assert contents == {}


async def test_backup_and_restore_on_s3_with_an_offloaded_segment(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, object]]
) -> None:
    url, options = s3_bucket
    bucket = url.split("/")[2]
    config = small_config(tmp_path / "data", tier2_url=url, tier2_options=options,
                          offload_url=f"s3://{bucket}/longterm", offload_options=options,
                          offload_deletion_lag_s=0.0, policy_interval_s=3600.0)
    payloads = _payloads(4)
    async with open_store(config) as store:
        for name, data in payloads.items():
            await store.create(name, make_parents=True)
            for start in range(0, len(data), 64 * KiB):
                await store.append(name, data[start:start + 64 * KiB])
        await store.seal("logs/a.log")
        await store.flush()
        await store.offload("logs/a.log")
        with trio.fail_after(60):
            while (status := await store.offload_status("logs/a.log"))["state"] == "RUNNING":
                await trio.sleep(0.05)
        assert status["state"] == "SUCCESS" and status["offloaded_bytes"] == len(payloads["logs/a.log"])
        await store.mkdir("after-the-offload")
        await store.flush()  # the offload's commits and the mkdir are shipped to tier-2 now
        old_epoch = store.epoch
    fresh = config.replace(data_dir=tmp_path / "fresh")
    report = await restore_store(fresh)
    assert report.epoch > old_epoch and not report.fsck.problems
    contents, _, problems = await _read_all(fresh, list(payloads))
    assert contents == payloads and not problems


async def test_clean_shutdown_backs_up_the_last_flushes(tmp_path: Path) -> None:
    tier2 = str(tmp_path / "tier2")
    # an interval far longer than the test: only the start-up and shutdown cycles run
    config = small_config(tmp_path / "data", tier2_url=tier2, flush_interval_s=3600.0)
    await _write_and_flush(config, {"late": b"flushed just before closing"})
    restored = restore_metadata(tmp_path / "new", tier2)
    assert restored.segments == 1


async def test_short_lived_stores_back_up_without_overlapping_cycles(tmp_path: Path) -> None:
    """A store closed while its first cycle runs: the shutdown cycle waits for it (two
    cycles sharing the connection and snapshot file failed with 'disk I/O error')."""
    tier2 = str(tmp_path / "tier2")
    config = small_config(tmp_path / "data", tier2_url=tier2)
    for i in range(8):
        async with open_store(config) as store:
            await store.create(f"s{i}")
        assert store.metadata_backup.failures == 0
    assert restore_metadata(tmp_path / "new", tier2).segments == 8


def test_a_change_batch_cut_off_mid_upload_is_never_taken_for_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = BackupObjects(str(tmp_path / "t2"))
    objects.upload_log(LogObject(1, 1, 5), b"whole batch")
    real_write = Path.write_bytes

    def killed_mid_write(path: Path, data: bytes) -> int:
        real_write(path, data[:3])
        raise OSError("killed")

    monkeypatch.setattr(Path, "write_bytes", killed_mid_write)
    with pytest.raises(Tier2Error):
        objects.upload_log(LogObject(1, 6, 9), b"the next batch")
    monkeypatch.undo()
    assert objects.logs() == [LogObject(1, 1, 5)]  # the cut-off one is not under its name
    assert objects.read_log(LogObject(1, 1, 5)) == b"whole batch"
