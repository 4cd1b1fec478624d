"""One owner per tier-2 (issue 15, item 1): claims on tier-2, refusal, takeover, fencing.

The daemon tests run real ``tierfs serve`` processes on a data dir and a copy of it
(made after a kill -9), sharing one tier-2: a local directory or a bucket on the moto
S3 server. Whichever copy starts first owns tier-2; the other is refused until it takes
over; the old owner, still running, is fenced within one flush interval, writes and
deletes nothing more, and saves what it acknowledged but never flushed in lost+found.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tierfs import open_store
from tierfs.blocks.filesystems import open_filesystem
from tierfs.contracts.errors import FencedError, OwnedElsewhereError, TierFSError, WrongTier2Error
from tierfs.contracts.operations import FSCK
from tierfs.engine.ownership import fencing
from tierfs.engine.ownership.claims import KEEP_CLAIMS, OwnerClaim, OwnerClaims
from tierfs.engine.ownership.fencing import IDLE_CHECK_INTERVALS, OwnerFence
from tierfs.engine.recovery.lost_found import entries
from tierfs.engine.tier2.chunk_storage import open_chunk_storage
from tierfs.testing.cli_runner import run_tierfs_text
from tierfs.testing.harness import Daemon, Mount, crash_copy, small_config, start_daemon
from tierfs.testing.storages import WrappedStorage

# The daemons never flush by age (only when asked), so what a zombie acknowledges after
# its last flush is certain to be unflushed when it is fenced; they check the claims
# every CHECK_INTERVAL_S.
FLUSH_INTERVAL_S = 60.0
CHECK_INTERVAL_S = 0.5
# fenced within one check interval; the rest is a loaded 2-core machine's slack
FENCED_WITHIN_S = CHECK_INTERVAL_S + 2.0
CHUNK_NAME = re.compile(r"s\d+/e(\d+)-c\d+$")


@pytest.fixture(params=["local", "s3"])
def tier2(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """(tier-2 URL, storage options) shared by both copies of the data dir."""
    if request.param == "local":
        return str(tmp_path / "shared-tier2"), {}
    url, options = request.getfixturevalue("s3_bucket")
    return url, dict(options)


def _config_file(path: Path, url: str, options: dict[str, Any]) -> Path:
    lines = [f'tier2_url = "{url}"', f"flush_interval_s = {FLUSH_INTERVAL_S}",
             f"owner_check_interval_s = {CHECK_INTERVAL_S}",
             "flush_bytes = 67108864", "max_chunk_bytes = 262144"]
    if "endpoint_url" in options:
        lines.append(f'tier2_endpoint_url = "{options["endpoint_url"]}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def _objects(url: str, options: dict[str, Any]) -> dict[str, str]:
    """Every chunk object on tier-2 by name: the SHA-256 of its bytes."""
    fs, root = open_filesystem(url, options)
    fs.invalidate_cache()
    found = {}
    for path in fs.find(root):
        name = path[len(root.rstrip("/")) + 1:]
        if CHUNK_NAME.match(name):
            found[name] = hashlib.sha256(fs.cat_file(path)).hexdigest()
    return found


def _epoch_objects(objects: dict[str, str], epoch: int) -> dict[str, str]:
    return {n: h for n, h in objects.items() if int(CHUNK_NAME.match(n).group(1)) == epoch}  # type: ignore[union-attr]


def _epoch(daemon: Daemon) -> int:
    client = daemon.client()
    try:
        return int(client.health()["epoch"])
    finally:
        client.close()


class Appender(threading.Thread):
    """Appends numbered records to a daemon until one is refused."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        super().__init__(daemon=True)
        self.client = daemon.client()
        self.segment = name
        self.acked: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None
        self.refused_at = 0.0

    def run(self) -> None:
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                record = b"zombie-%06d\n" % len(self.acked)
                self.acked.append((self.client.append(self.segment, record), record))
                time.sleep(0.002)
        except TierFSError as e:
            self.error = e
            self.refused_at = time.monotonic()
        finally:
            self.client.close()


# ---------------------------------------------------------------- claims themselves
def test_a_claim_is_created_exclusively(
    tier2: tuple[str, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    claims = OwnerClaims(open_chunk_storage(*tier2))
    first, second = OwnerClaim.new(7, tmp_path / "a"), OwnerClaim.new(7, tmp_path / "b")
    claims.create(first)
    with pytest.raises(OwnedElsewhereError) as refused:
        claims.create(second)  # S3: If-None-Match: * (moto's server answers 412)
    assert refused.value.owner_id == first.owner_id and refused.value.epoch == 7
    assert claims.current() == first
    assert "does not honour exclusive creation" not in caplog.text


async def test_old_claims_are_pruned_and_hidden_from_chunk_listings(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "t2"))
    for _ in range(KEEP_CLAIMS + 4):
        async with open_store(config) as store:
            pass
    assert store.epoch == KEEP_CLAIMS + 4
    claim_files = sorted(p.name for p in (tmp_path / "t2" / "_owner").iterdir())
    assert claim_files == [f"epoch-{e:06d}" for e in range(4, KEEP_CLAIMS + 5)]
    assert store.chunk_storage.list() == []


async def test_a_fresh_data_dir_on_a_used_tier2_is_refused(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "a", tier2_url=str(tmp_path / "t2"))) as a:
        await a.create("seg")
        await a.append("seg", b"from a")
    with pytest.raises(OwnedElsewhereError, match="never claimed it"):
        async with open_store(small_config(tmp_path / "b", tier2_url=str(tmp_path / "t2"))):
            pass
    async with open_store(small_config(tmp_path / "b", tier2_url=str(tmp_path / "t2"), takeover=True)) as b:
        assert b.epoch == a.epoch + 1  # above every claim: its chunk names are new


async def test_in_process_zombie_is_fenced_and_keeps_its_tail(tmp_path: Path) -> None:
    shared = str(tmp_path / "t2")
    async with open_store(small_config(tmp_path / "a", tier2_url=shared)) as a:
        await a.create("seg")
        await a.append("seg", b"flushed;")
        await a.flush()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    slow = dict(flush_bytes=1 << 30, flush_interval_s=30.0, owner_check_interval_s=0.1)
    async with open_store(small_config(tmp_path / "a", tier2_url=shared, **slow)) as zombie:
        await zombie.append("seg", b"acknowledged, never flushed")
        async with open_store(small_config(tmp_path / "b", tier2_url=shared, takeover=True)) as owner:
            await owner.append("seg", b"new owner")
            await owner.flush()
            with pytest.raises(FencedError):
                for _ in range(100):
                    await zombie.append("seg", b"!")
                    await zombie.sync()
                    await trio.sleep(0.02)
            with pytest.raises(FencedError):
                await zombie.flush()
            assert await owner.read("seg") == b"flushed;new owner"
            with trio.fail_after(10):
                await zombie.fence.handled.wait()  # lost+found written
            report = await zombie.fsck()
            assert [p.chunk for p in report.problems] == ["lost+found/seg.e000002"]
    (entry,) = entries(tmp_path / "a")
    saved = (tmp_path / "a" / entry.path).read_bytes()
    assert saved.startswith(b"acknowledged, never flushed")
    assert set(saved[len(b"acknowledged, never flushed"):]) <= {ord("!")}
    assert entry.description is not None and entry.description["start_offset"] == len(b"flushed;")


def test_an_idle_store_checks_less_often_and_its_next_append_brings_the_check_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle (nothing appended, no flush waited for), a store looks at tier-2's claims
    only every IDLE_CHECK_INTERVALS intervals; the first append after the pause starts a
    check within one interval, so a zombie's window after a takeover is what it was.
    The fence alone on a mock clock, its checks inline (no thread lets the clock jump)."""
    interval_s = 1.0
    config = small_config(tmp_path / "a", tier2_url=str(tmp_path / "t2"), flush_interval_s=interval_s,
                          owner_check_interval_s=interval_s)

    async def owned() -> None:
        async with open_store(config) as store:
            await store.create("seg")

    trio.run(owned)
    storage = open_chunk_storage(str(tmp_path / "t2"))
    claim = OwnerClaims(storage).current()
    assert claim is not None

    async def inline(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args)

    monkeypatch.setattr(fencing.trio.to_thread, "run_sync", inline)

    async def watch() -> None:
        fence = OwnerFence(claim, storage, trio.CapacityLimiter(1), config)
        async with trio.open_nursery() as nursery:
            await nursery.start(fence.run)
            await trio.sleep(interval_s / 2)
            assert fence.checks == 1  # the first one at once
            idle_s = 10 * IDLE_CHECK_INTERVALS * interval_s
            await trio.sleep(idle_s)
            assert fence.checks == 1 + 10
            fence.ensure_owner()  # what an append does first: the store is in use
            asked_at = trio.current_time()
            while fence.passed_started_s < asked_at:
                await trio.sleep(interval_s / 10)
            assert fence.passed_started_s - asked_at <= interval_s
            checks = fence.checks
            for _ in range(10):  # in use: a check every interval
                fence.ensure_owner()
                await trio.sleep(interval_s)
            assert fence.checks - checks >= 9
            nursery.cancel_scope.cancel()

    trio.run(watch, clock=MockClock(autojump_threshold=0))


# ---------------------------------------------------------------- real daemons
@pytest.mark.parametrize("first", ["original", "copy"])
def test_copied_data_dir_one_owner_takeover_fences_the_other(
    first: str, tier2: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = tier2
    config = _config_file(tmp_path / "tierfs.toml", url, options)
    original, copy = tmp_path / "original", tmp_path / "copy"

    # the original runs, flushes some bytes, acknowledges more, and is killed -9
    daemon = start_daemon(original, config_file=config)
    client = daemon.client()
    client.create("log")
    client.create("old")
    base = b"".join(b"base-%03d\n" % i for i in range(50))
    client.append("log", base)
    client.append("old", b"old bytes, shared by both copies\n" * 100)
    client.op("flush")
    client.append("log", b"journal-only\n")  # acknowledged (PD), not flushed
    client.close()
    daemon.kill9()
    crash_copy(original, copy)

    owner_dir, other_dir = (original, copy) if first == "original" else (copy, original)
    if first == "copy":  # a copy is not an owner: it opens only when told to take over
        refused = Daemon(copy, ["serve"], config_file=config)
        code, stderr = refused.wait()
        assert code == 5 and "this data dir is a copy of the one that claimed it" in stderr, stderr
    owner = start_daemon(owner_dir, *(["--takeover"] if first == "copy" else []), config_file=config)
    try:
        # the other copy is refused, naming the owner
        refused = Daemon(other_dir, ["serve"], config_file=config)
        code, stderr = refused.wait()
        assert code == 5, stderr
        assert f"pid {owner.pid}" in stderr and f"data dir {owner_dir}" in stderr, stderr
        assert "tierfs takeover" in stderr

        # the owner acknowledges appends without pause while the other copy takes over
        writer = Appender(owner, "log")
        writer.start()
        while len(writer.acked) < 20 and writer.is_alive():
            time.sleep(0.01)
        new_owner = start_daemon(other_dir, "--takeover", config_file=config)
        took_over_at = time.monotonic()
        writer.join(timeout=30)
        assert isinstance(writer.error, FencedError), writer.error
        assert writer.refused_at - took_over_at < FENCED_WITHIN_S
        zombie = owner
        zombie_epoch, new_epoch = _epoch(zombie), _epoch(new_owner)
        assert new_epoch > zombie_epoch

        # the new owner writes; every byte it acknowledged reads back
        new_client = new_owner.client()
        expected_log = base + b"journal-only\n"
        assert new_client.read("log") == expected_log
        for i in range(30):
            record = b"new-owner-%03d\n" % i
            new_client.append("log", record)
            expected_log += record
        new_client.op("flush")
        assert new_client.read("log") == expected_log
        new_objects = _epoch_objects(_objects(url, options), new_epoch)
        assert new_objects

        # the zombie: appends refused, it deletes nothing (its garbage waits) and
        # writes no chunk any more, its unflushed acknowledged bytes are in lost+found
        zombie_client = zombie.client()
        with pytest.raises(FencedError):
            zombie_client.append("log", b"late")
        zombie_objects = _epoch_objects(_objects(url, options), zombie_epoch)
        zombie_client.delete("old")
        deadline = time.monotonic() + 10
        while not zombie_client.metrics()["tierfs_lost_found_bytes_total"]:  # being saved
            assert time.monotonic() < deadline
            time.sleep(0.05)
        fsck = zombie_client.call(FSCK)
        zombie_log = zombie_client.read("log")
        flushed = zombie_client.stat("log").flushed_length
        metrics, health = zombie_client.metrics(), zombie_client.health()
        zombie_client.close()
        assert metrics["tierfs_fenced"] == 1 and health["fenced"] is True
        lost = [e for e in entries(owner_dir) if e.description and e.description["segment"] == "log"]
        assert len(lost) == 1, entries(owner_dir)
        (entry,) = lost
        saved = (owner_dir / entry.path).read_bytes()
        assert entry.description is not None
        assert entry.description["start_offset"] == flushed and entry.description["epoch"] == zombie_epoch
        assert saved and zombie_log[flushed:] == saved
        assert metrics["tierfs_lost_found_bytes_total"] == len(saved)
        for offset, record in writer.acked:  # every acknowledged record is kept
            assert zombie_log[offset:offset + len(record)] == record
        assert [p.chunk for p in fsck.problems] == [entry.path]
        code, stderr = zombie.stop()
        assert code == 0, stderr

        # nothing of the new owner was overwritten or deleted, the zombie wrote no more
        # chunks, and the shared segment the zombie deleted still reads back whole
        after = _objects(url, options)
        assert _epoch_objects(after, new_epoch) == new_objects
        assert _epoch_objects(after, zombie_epoch) == zombie_objects
        assert new_client.read("old") == b"old bytes, shared by both copies\n" * 100
        assert new_client.call(FSCK).problems == []
        new_client.close()

        # the zombie's data dir stays refused after a restart
        code, stderr = Daemon(owner_dir, ["serve"], config_file=config).wait()
        assert code == 5 and f"data dir {other_dir}" in stderr, stderr
        assert json.loads((owner_dir / "owner-claim.json").read_text())["epoch"] == zombie_epoch
    finally:
        for process in (owner, locals().get("new_owner")):
            if isinstance(process, Daemon) and process.proc.poll() is None:
                process.stop()


def _tierfs(data_dir: Path, tier2_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in this process (each one opens and closes its store, as a process would)."""
    return run_tierfs_text("--data-dir", str(data_dir), "--tier2", tier2_url, *args)


def test_cli_owner_and_takeover(tmp_path: Path) -> None:
    shared = str(tmp_path / "t2")
    a, b = tmp_path / "a", tmp_path / "b"
    assert _tierfs(a, shared, "create", "seg").returncode == 0
    shutil.copytree(a, b)
    assert _tierfs(a, shared, "append", "seg", "from a").returncode == 0  # a claims the next epoch
    refused = _tierfs(b, shared, "cat", "seg")
    assert refused.returncode == 5 and f"data dir {a}" in refused.stderr, refused.stderr
    owner = _tierfs(b, shared, "owner", "--json")
    assert owner.returncode == 5
    report = json.loads(owner.stdout)
    assert report["owns_tier2"] is False and report["current_owner"]["data_dir"] == str(a)
    took = _tierfs(b, shared, "takeover")
    assert took.returncode == 0 and f"data dir {a}" in took.stdout, took.stderr
    assert _tierfs(b, shared, "owner").returncode == 0
    assert _tierfs(a, shared, "owner").returncode == 5
    assert _tierfs(a, shared, "--takeover", "cat", "seg").stdout == "from a"


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
def test_a_fenced_mount_refuses_writes_with_erofs(tmp_path: Path) -> None:
    config = _config_file(tmp_path / "tierfs.toml", str(tmp_path / "shared-tier2"), {})
    mount = Mount(tmp_path / "host-a", tmp_path / "mnt", config_file=config)
    second_host = None
    try:
        path = mount.path("app.log")
        with open(path, "ab") as f:
            f.write(b"before the takeover\n")
        second_host = start_daemon(tmp_path / "host-b", "--takeover", config_file=config)
        took_over_at = time.monotonic()
        with pytest.raises(OSError) as refused:
            while time.monotonic() - took_over_at < 30:
                with open(path, "ab") as f:
                    f.write(b"still writing\n")
                time.sleep(0.01)
        assert refused.value.errno == errno.EROFS
        assert time.monotonic() - took_over_at < FENCED_WITHIN_S
        acknowledged = path.read_bytes()  # reads keep working
        assert acknowledged.startswith(b"before the takeover\n")
    finally:
        mount.unmount()
        if second_host is not None:
            second_host.stop()
    # nothing was flushed (no flush by age in these tests): every acknowledged byte is there
    (entry,) = entries(tmp_path / "host-a")
    assert (tmp_path / "host-a" / entry.path).read_bytes() == acknowledged


async def test_a_zombie_deletes_no_shared_object_hot_copy_or_offloaded(tmp_path: Path) -> None:
    shared = dict(tier2_url=str(tmp_path / "t2"), offload_url=str(tmp_path / "longterm"),
                  offload_deletion_lag_s=3600.0, policy_interval_s=3600.0)
    payload = b"offloaded, and shared by both copies\n" * 5000
    async with open_store(small_config(tmp_path / "a", **shared)) as a:
        await a.create("seg")
        await a.append("seg", payload)
        await a.seal("seg")
        await a.flush("seg")
        await a.offload("seg")
        with trio.fail_after(30):
            while (await a.offload_status("seg"))["state"] == "RUNNING":
                await trio.sleep(0.02)
        assert (await a.offload_status("seg"))["state"] == "SUCCESS"
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    def objects() -> list[Path]:
        return sorted(p for root in ("t2", "longterm") for p in (tmp_path / root).rglob("s*/*"))

    before = objects()
    assert any(p.name.endswith(".data") for p in before) and any("t2" in p.parts for p in before)
    check = dict(owner_check_interval_s=0.05)
    async with open_store(small_config(tmp_path / "a", **shared, **check)) as zombie:
        async with open_store(small_config(tmp_path / "b", **shared, takeover=True)) as owner:
            with trio.fail_after(10):
                while not zombie.fence.fenced:
                    await trio.sleep(0.02)
            zombie.clock = lambda: time.time() + 7200.0  # the deletion lag has passed
            with pytest.raises(FencedError):  # the scheduler's loop logs it and retries
                await zombie.scheduler.scan()  # would delete the hot copies
            await zombie.delete("seg")  # queues the chunk and its offloaded objects
            await zombie.garbage.collect()
            assert objects() == before
            owner.block_cache.clear()
            assert await owner.read("seg") == payload
            assert (await owner.fsck()).problems == []


# ---------------------------------------------------------------- a copy is not an owner
class ObjectPerFlush(WrappedStorage):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.supports_append = False


def _copy(source: Path, target: Path) -> None:
    crash_copy(source, target)


async def test_a_copy_of_a_running_data_dir_is_not_an_owner(tmp_path: Path) -> None:
    """Path 3 of the data-safety issue: the copy carried the original's claim and opened
    as the owner, fencing the original; its orphan sweep then deleted what the original
    flushed after the copy was made (its metadata never saw those chunks)."""
    tier2 = str(tmp_path / "t2")
    original, copy = tmp_path / "original", tmp_path / "copy"
    flushed_after_copy = b"flushed by the original after the copy was made\n"
    async with open_store(small_config(original, tier2_url=tier2)) as store:
        store.chunk_storage = ObjectPerFlush(store.chunk_storage)  # as on S3: every flush a new object
        await store.create("log")
        await store.append("log", b"before the copy\n")
        await store.flush("log")
        _copy(original, copy)  # a snapshot of the running data dir
        await store.append("log", flushed_after_copy)
        await store.flush("log")
        with pytest.raises(OwnedElsewhereError, match="this data dir is a copy of the one that claimed it"):
            async with open_store(small_config(copy, tier2_url=tier2)):
                pass
        assert not store.fence.fenced  # the refused copy changed nothing
        await store.append("log", b"still the owner\n")
    # told to take over, the copy owns tier-2, but never deletes what its metadata does
    # not know of the original's epochs: the original's data dir still references it
    grace_zero = dict(tier2_url=tier2, orphan_grace_s=0, orphan_gc_interval_s=0, offload_deletion_lag_s=0)
    async with open_store(small_config(copy, takeover=True, **grace_zero)) as store:
        store.chunk_storage = ObjectPerFlush(store.chunk_storage)
        # its own work drops references the original still has: defrag merges the chunks
        # they share, the merged-away ones are collected; none of them is deleted
        for index in range(3):
            await store.append("log", b"the copy's %d\n" % index)
            await store.flush("log")
        await store.seal("log")
        merged = await store.defrag("log")
        assert merged["runs_merged"] >= 1
        await store.garbage.collect()
        report = await store.gc()
        assert report.orphans == [] and len(report.kept_older_owner) >= 1
        assert {o.epoch for o in report.kept_older_owner} == {1}
    async with open_store(small_config(original, takeover=True, **grace_zero)) as store:
        assert (await store.read("log")).endswith(flushed_after_copy + b"still the owner\n")
        assert (await store.fsck()).problems == []
        assert (await store.gc()).orphans == []  # the copy's epoch: kept for it alike
    async with open_store(small_config(copy, takeover=True, **grace_zero)) as store:
        report = await store.gc(older_owners=True)  # asked for explicitly: gone
        assert report.orphans and report.kept_older_owner == []


async def test_a_kill_between_the_claim_and_its_record_leaves_the_data_dir_its_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path 9: killed after its claim was created on tier-2 and before the data dir
    recorded it, the next open found a claim that was not "its own"."""
    from tierfs.engine.ownership import claims as owner_claims

    config = small_config(tmp_path / "d", tier2_url=str(tmp_path / "t2"))
    async with open_store(config) as store:
        await store.create("s")

    def killed(data_dir: Path, claim: OwnerClaim) -> None:
        raise KeyboardInterrupt  # stands for the kill: nothing after it runs

    with monkeypatch.context() as patched:
        patched.setattr(owner_claims, "write_local_claim", killed)
        with pytest.raises(KeyboardInterrupt):
            async with open_store(config):
                pass
    async with open_store(config) as store:  # not refused: the pending claim is this data dir's
        assert store.epoch == 3
        await store.append("s", b"after the kill")


async def test_a_data_dir_never_opens_on_another_tier2(tmp_path: Path) -> None:
    """A command that forgot --tier2 claimed the data dir's own chunks/ and appended
    there, beside the store it belongs to (the chaos harness found it)."""
    data = tmp_path / "d"
    async with open_store(small_config(data, tier2_url=str(tmp_path / "t2"))) as store:
        await store.create("s")
    for other in ("", str(tmp_path / "elsewhere")):
        with pytest.raises(WrongTier2Error, match="belongs to tier-2"):
            async with open_store(small_config(data, tier2_url=other)):
                pass
    assert not (data / "chunks").exists() and not (tmp_path / "elsewhere").exists()
    moved = tmp_path / "moved"  # its own chunks/ move with a data dir
    async with open_store(small_config(tmp_path / "own")) as store:
        await store.create("s")
    (tmp_path / "own").rename(moved)
    async with open_store(small_config(moved)) as store:  # renamed, not copied: still the owner
        assert (await store.stat("s")).name == "s"


async def test_lost_found_lists_and_restores_what_a_fenced_store_saved_each_append_once(tmp_path: Path) -> None:
    """Must-have 10: what sits in lost+found is readable and restorable, and a restore
    never appends twice what the segment holds already (writer identities)."""
    import argparse

    from tierfs.cli.commands.lost_found import lost_found_command
    from tierfs.contracts.writers import Writer

    tier2 = str(tmp_path / "t2")
    config = dict(tier2_url=tier2, flush_bytes=1 << 30, flush_interval_s=3600.0)
    writer = Writer()
    identities = [writer.next() for _ in range(3)]
    async with open_store(small_config(tmp_path / "a", **config)) as zombie:
        await zombie.create("seg")
        await zombie.append("seg", b"flushed;")
        await zombie.flush()
        for identity in identities:
            await zombie.append("seg", b"%d;" % identity.seq, writer=identity)
        await zombie.append("seg", b"anonymous;")
        _copy(tmp_path / "a", tmp_path / "b")
        async with open_store(small_config(tmp_path / "b", takeover=True, **config)) as owner:
            with pytest.raises(FencedError):
                await zombie.fence.confirm()  # it sees the newer claim now
            with trio.fail_after(30):
                await zombie.fence.handled.wait()
            # a writer sent its second append again to the new owner (an answer was lost)
            await owner.append("seg", b"2;", writer=identities[1])
    (entry,) = entries(tmp_path / "a")
    assert entry.segment == "seg" and "took tier-2 over" in entry.why and entry.size == len(b"1;2;3;anonymous;")
    async with open_store(small_config(tmp_path / "b", **config)) as owner:
        args = argparse.Namespace(url=None, data_dir=str(tmp_path / "a"), action="restore", entry=entry.path,
                                  to=None, keep=False, json=False)
        assert await lost_found_command(args, owner) == 0
        # the copy replayed "flushed;1;2;3;anonymous;" from the journal it copied: the
        # identified appends are not appended again; an anonymous one has no identity
        data = await owner.read("seg")
    assert data == b"flushed;1;2;3;anonymous;anonymous;"
    assert entries(tmp_path / "a") == []


def test_a_container_data_dir_kept_aside_is_one_entry_described_or_not(tmp_path: Path) -> None:
    from tierfs.engine.recovery.lost_found import entries

    for name, described in (("c001.lease-2", False), ("c003.lease-4", True)):
        kept = tmp_path / "lost+found" / name
        (kept / "journal").mkdir(parents=True)
        (kept / "journal" / "00000000000000000000.jnl").write_bytes(b"x" * 100)
        (kept / "LOCK").write_text("12345\n")
        (kept / "lost+found" / "t1").mkdir(parents=True)
        if described:
            (kept / "LOST.json").write_text('{"container": 3, "lease_epoch": 4, "why": "another daemon owned it"}')
    lines = [entry.line() for entry in entries(tmp_path)]
    assert lines == [
        "lost+found/c001.lease-2: a container's journal of 100 bytes, epoch unknown, not replayed: no description",
        "lost+found/c003.lease-4: a container's journal of 100 bytes, epoch 4, not replayed: another daemon owned it",
    ]
