"""Offload with a real daemon and a long-term S3 store (moto server on 127.0.0.1):
kill -9 at every step of the attempt protocol, then restart and check every byte;
offloaded data read back through the mount, fsspec and the CLI."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
import trio
from tierfs.fsspec_impl import TierFileSystem

from tierfs import open_store
from tierfs.engine.object_keys import OffloadKeys
from tierfs.store.fsck import fsck
from tierfs.testing.crash import OFFLOAD_CRASH_POINTS, crash_environment, wait_for_crash
from tierfs.testing.harness import Mount, small_config, start_daemon

KiB = 1 << 10
PAYLOAD = os.urandom(1100 * KiB)


@pytest.fixture
def offload_env(s3_bucket: tuple[str, dict[str, Any]]) -> dict[str, str]:
    url, options = s3_bucket
    bucket = url.split("/")[2]
    return {
        "TIERFS_OFFLOAD_TO": f"s3://{bucket}/longterm",
        "TIERFS_OFFLOAD_ENDPOINT_URL": str(options["endpoint_url"]),
        "TIERFS_OFFLOAD_DELETION_LAG_S": "0",
        "TIERFS_POLICY_INTERVAL_S": "3600",
        # small_config's thresholds, so the payload spans several chunks
        "TIERFS_FLUSH_INTERVAL_S": "0.05",
        "TIERFS_FLUSH_BYTES": str(64 * KiB),
        "TIERFS_MAX_CHUNK_BYTES": str(256 * KiB),
        "TIERFS_MAX_FLUSH_BYTES": str(128 * KiB),
        "TIERFS_JOURNAL_FILE_BYTES": str(128 * KiB),
    }


def _config(data_dir: Path, env: dict[str, str]) -> Any:
    return small_config(
        data_dir, offload_url=env["TIERFS_OFFLOAD_TO"],
        offload_endpoint_url=env["TIERFS_OFFLOAD_ENDPOINT_URL"],
        offload_deletion_lag_s=0.0, policy_interval_s=3600.0,
    )


def _long_term_keys(env: dict[str, str]) -> list[str]:
    bucket = env["TIERFS_OFFLOAD_TO"].split("/")[2]
    s3 = boto3.client("s3", endpoint_url=env["TIERFS_OFFLOAD_ENDPOINT_URL"], region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="longterm/")
    return sorted(o["Key"][len("longterm/"):] for o in listed.get("Contents", []))


async def _wait_done(store: Any, name: str) -> dict[str, Any]:
    with trio.fail_after(60):
        while (status := await store.offload_status(name))["state"] == "RUNNING":
            await trio.sleep(0.02)
    return status


@pytest.mark.parametrize("point", OFFLOAD_CRASH_POINTS)
async def test_kill_9_at_every_step_of_an_offload_attempt(
    point: str, tmp_path: Path, offload_env: dict[str, str]
) -> None:
    data_dir = tmp_path / "data"
    daemon = start_daemon(data_dir, env={**offload_env, **crash_environment(point)})
    client = daemon.client()
    client.create("c/seg", parents=True)
    for start in range(0, len(PAYLOAD), 32 * KiB):
        client.append("c/seg", PAYLOAD[start : start + 32 * KiB])
    client.op("seal", path="c/seg")
    client.op("flush", path="c/seg")
    assert client.op("offload", path="c/seg")["state"] == "RUNNING"
    code, stderr = wait_for_crash(daemon, timeout_s=60)  # it kills itself
    client.close()
    assert code == -signal.SIGKILL, stderr[-2000:]
    assert f"crash point {point} reached" in stderr

    config = _config(data_dir, offload_env)
    async with open_store(config) as store:
        seg = store._segment("c/seg")
        chunks = await store.chunks_of(seg)
        if point == "offload.attempt_recorded":
            assert any(c.offload_attempt_uuid and not c.offload_complete for c in chunks)
        if point in ("offload.completed", "offload.hot_deleted"):
            assert any(c.offload_complete for c in chunks)
        for chunk in chunks:  # wherever each chunk is, it is whole there
            if not chunk.offload_complete:
                assert (config.data_dir / "chunks" / chunk.name).stat().st_size >= chunk.length
        assert await store.read("c/seg") == PAYLOAD
        assert (await fsck(store)).problems == []

        # the next attempt finishes the job and removes what the failed one left
        await store.offload("c/seg")
        assert (await _wait_done(store, "c/seg"))["state"] == "SUCCESS"
        chunks = await store.chunks_of(seg)
        assert all(c.offload_complete and c.offload_hot_deleted for c in chunks), [(c.offload_complete, c.offload_hot_deleted, store.offloader._hot_pending) for c in chunks]
        assert not any((config.data_dir / "chunks" / c.name).exists() for c in chunks)
        expected_keys = sorted(
            key for c in chunks
            for key in (lambda k: (k.data, k.index))(OffloadKeys.for_attempt(c.name, c.offload_attempt_uuid))
        )
        assert _long_term_keys(offload_env) == expected_keys
        store.block_cache.clear()
        assert await store.read("c/seg") == PAYLOAD
        assert (await fsck(store)).problems == []


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="needs /dev/fuse and fusermount3 (apt install fuse3)")
def test_offloaded_data_reads_back_through_every_front_end(
    tmp_path: Path, offload_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(3 * 1024 * KiB + 123)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    mount = Mount(tmp_path / "data", tmp_path / "mnt", env=offload_env)
    try:
        target = mount.path("logs/f.bin")
        target.parent.mkdir()
        subprocess.run(["cp", str(source), str(target)], check=True)
        subprocess.run(["chmod", "a-w", str(target)], check=True)  # seals it

        done = _cli(mount.data_dir, "offload", "logs/f.bin")
        assert done.returncode == 0, done.stderr
        assert "100%" in done.stderr and "SUCCESS" in done.stdout
        status = _cli(mount.data_dir, "offload-status", "logs/f.bin", "--wait")
        assert status.returncode == 0 and "SUCCESS" in status.stdout
        assert f"offloaded {len(data) / (1 << 20):.1f} MiB" in status.stdout
        assert _cli(mount.data_dir, "offload", "logs/f.bin", "--no-wait").returncode == 0

        # the mount: cat, sha256sum, getfattr
        read = subprocess.run(["sha256sum", str(target)], capture_output=True, text=True, check=True)
        assert read.stdout.split()[0] == digest
        offloaded = subprocess.run(
            ["getfattr", "-n", "user.tierfs.offloaded_length", "--only-values", str(target)],
            capture_output=True, text=True, check=True).stdout
        assert int(offloaded) == len(data)
        metrics = mount.client().metrics()
        assert metrics["tierfs_offloaded_bytes_total"] == len(data)

        # fsspec: through the daemon, and directly from S3 with storage options
        monkeypatch.setenv("TIERFS_DATA_DIR", str(mount.data_dir))
        TierFileSystem.clear_instance_cache()
        assert TierFileSystem().cat_file("logs/f.bin") == data
        direct = TierFileSystem(chunk_storage_options={"endpoint_url": offload_env["TIERFS_OFFLOAD_ENDPOINT_URL"]})
        with direct.open("logs/f.bin", "rb") as f:
            assert f.read() == data
        assert direct.bytes_fetched_direct == len(data) and direct.bytes_fetched_daemon == 0

        # the CLI: cat, and policies
        cat = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(mount.data_dir),
                              "cat", "logs/f.bin"], capture_output=True, timeout=120)
        assert cat.returncode == 0 and hashlib.sha256(cat.stdout).hexdigest() == digest
        assert _cli(mount.data_dir, "policy", "set", "logs", "offload_after_s=60").returncode == 0
        shown = _cli(mount.data_dir, "policy", "get", "logs/f.bin")
        assert "offload_after_s    1m  (from logs)" in shown.stdout
        bad = _cli(mount.data_dir, "policy", "set", "/", "retention_s=60")
        assert bad.returncode == 1 and "at or above" in bad.stderr
    finally:
        code, stderr = mount.unmount()
    assert code == 0, stderr
