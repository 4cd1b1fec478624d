"""tierfs on S3 (moto, server mode) behind the fault-injecting proxy: 503 SlowDown,
resets mid-body, stalls and an outage. Nothing acknowledged is lost or corrupted,
appends go on while S3 is away, flushing resumes on its own, a stalled GET is
abandoned after its deadline, fsck retries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tierfs import open_store
from tierfs.contracts.errors import BacklogFullError, Tier2Error
from tierfs.contracts.operations import FLUSH, FSCK
from tierfs.engine.tier2 import chunk_storage as chunkstore
from tierfs.remote import client as client_module
from tierfs.store.fsck import fsck
from tierfs.testing.faults.fault_proxy import FaultProxy, Faults
from tierfs.testing.harness import small_config, start_daemon

KiB = 1 << 10
RECORD_BYTES = 3000


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint, seed=15) as running:
        yield running


@pytest.fixture
def proxied_bucket(s3_bucket: tuple[str, dict[str, object]], proxy: FaultProxy) -> tuple[str, dict[str, object]]:
    """(tier-2 URL, storage options) of a fresh bucket, reached through the proxy."""
    url, options = s3_bucket
    return url, {**options, "endpoint_url": proxy.url}


def record(i: int) -> bytes:
    return (b"%06d:" % i) * (RECORD_BYTES // 7) + b"\n"


def test_the_proxy_forwards_unchanged_and_answers_slowdown_with_s3_xml(proxy: FaultProxy, proxied_bucket) -> None:  # type: ignore[no-untyped-def]
    import s3fs

    url, options = proxied_bucket
    fs = s3fs.S3FileSystem(endpoint_url=options["endpoint_url"], skip_instance_cache=True)
    payload = os.urandom(300 * KiB)
    fs.pipe_file(f"{url}/o", payload)
    assert fs.cat_file(f"{url}/o", start=1000, end=200 * KiB) == payload[1000 : 200 * KiB]
    proxy.faults = Faults(slowdown_rate=1.0, max_faults=1)
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1",
                          config=Config(retries={"total_max_attempts": 1}))
    with pytest.raises(client.exceptions.ClientError) as raised:
        client.get_object(Bucket=url.split("/")[2], Key="chunks/o")
    assert raised.value.response["Error"]["Code"] == "SlowDown"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert proxy.counters.slowdowns == 1


async def test_nothing_acked_is_lost_or_corrupted_through_503s_resets_and_stalls(
    tmp_path: Path, proxy: FaultProxy, proxied_bucket
) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options,
                          tier2_retry_max_s=0.5, tier2_read_timeout_s=0.5)
    proxy.faults = Faults(slowdown_rate=0.1, reset_rate=0.05, stall_rate=0.05, stall_s=3.0)
    acked = bytearray()
    async with open_store(config) as store:
        await store.create("a")
        for i in range(300):
            await store.append("a", record(i))
            acked += record(i)
        await store.flush()
        assert (await store.stat("a")).flushed_length == len(acked)
    writes = proxy.counters.faults
    assert writes > 0, "the flushes met no fault: the test tests nothing"
    proxy.faults = Faults(slowdown_rate=0.1, reset_rate=0.05, stall_rate=0.1, stall_s=3.0, methods=frozenset({"GET"}))
    async with open_store(config) as store:  # an empty block cache: every chunk is a GET
        read_back = await store.read("a")
    assert proxy.counters.faults > writes
    assert len(read_back) == len(acked), "bytes acknowledged were lost"
    assert read_back == bytes(acked), "bytes read back differ from the bytes acknowledged"


async def test_a_stalled_get_and_its_twin_are_abandoned_at_the_deadline(
    tmp_path: Path, proxy: FaultProxy, proxied_bucket
) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options, tier2_read_timeout_s=0.5)
    payload = b"".join(record(i) for i in range(30))  # one chunk, one block
    async with open_store(config) as store:
        await store.create("a")
        await store.append("a", payload)
        await store.flush()
    stall_s = 30.0
    proxy.faults = Faults(stall_rate=1.0, stall_s=stall_s, methods=frozenset({"GET"}), max_faults=2,
                          path_contains="/s0")  # chunk objects only: not the owner claims
    async with open_store(config) as store:
        requests_before = proxy.counters.requests
        started_s = time.monotonic()
        assert await store.read("a") == payload
        waited_s = time.monotonic() - started_s
    # the GET and its twin (after 0.125 s) both stalled; at the 0.5 s deadline both were
    # abandoned and the second attempt's GET answered
    assert proxy.counters.stalls == 2
    # the two stalled GETs and the one that answered (more only on a loaded machine,
    # where the second attempt's GET may be slow enough to be hedged itself)
    assert proxy.counters.requests - requests_before >= 3
    assert waited_s < stall_s / 3, f"the read waited {waited_s:.1f} s: the stall was waited out"


async def test_outage_appends_go_on_to_the_backlog_bound_then_flushing_resumes(
    tmp_path: Path, proxy: FaultProxy, proxied_bucket, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(chunkstore, "READ_RETRY_ATTEMPTS", 3)  # a quick "cannot read" below
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options,
                          tier2_retry_initial_s=0.05, tier2_retry_max_s=0.5,
                          max_backlog_bytes=256 * KiB, max_append_bytes=64 * KiB)
    acked = bytearray()
    async with open_store(config) as store:
        await store.create("a")
        for i in range(20):
            await store.append("a", record(i))
            acked += record(i)
        await store.flush()
        flushed_before = len(acked)
        await store.create("b")  # a cold chunk to read during the outage
        await store.append("b", b"cold bytes")
        await store.flush()
    async with open_store(config) as store:
        assert await store.read("a", 0, flushed_before) == bytes(acked)  # now cached
        proxy.outage(60)
        assert await store.read("a", 0, flushed_before) == bytes(acked)  # from the cache
        refused = False
        for i in range(20, 400):
            try:
                await store.append("a", record(i))
            except BacklogFullError:
                refused = True
                break
            acked += record(i)
        assert refused, "the backlog bound never refused an append"
        assert len(acked) > flushed_before + 128 * KiB, "appends were refused long before the bound"
        info = await store.stat("a")
        assert info.durable_length == len(acked) and info.flushed_length < len(acked)
        # the tail reads from memory and the journal while S3 is away
        assert await store.read("a", flushed_before) == bytes(acked[flushed_before:])
        with pytest.raises(Tier2Error, match="after 3 attempts"):
            await store.read("b")
        assert proxy.counters.refused > 0
        proxy.end_outage()
        with trio.fail_after(30):
            while (await store.stat("a")).flushed_length < len(acked):
                await trio.sleep(0.05)
        await store.append("a", record(400))  # accepted again
        acked += record(400)
        await store.flush()
    async with open_store(config) as store:
        assert await store.read("a") == bytes(acked)
        assert await store.read("b") == b"cold bytes"


def test_fsck_through_503s_resets_and_stalls_exits_0(
    tmp_path: Path, proxy: FaultProxy, proxied_bucket, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config_file = tmp_path / "tierfs.toml"
    config_file.write_text(  # GETs hedged after 1 s: a stall makes fsck take a second
        f'tier2_url = "{url}"\nflush_interval_s = 0.05\nflush_bytes = 65536\n'
        f'max_chunk_bytes = 131072\nmax_flush_bytes = 131072\ntier2_read_timeout_s = 4.0\n'
        f'[tier2_options]\nendpoint_url = "{options["endpoint_url"]}"\n'
    )
    data_dir = tmp_path / "data"
    daemon = start_daemon(data_dir, config_file=config_file)
    try:
        client = daemon.client()
        client.create("logs/a", parents=True)
        client.append("logs/a", b"".join(record(i) for i in range(200)))
        client.call(FLUSH)
        client.close()
        proxy.faults = Faults(slowdown_rate=0.3, reset_rate=0.1, stall_rate=0.05, stall_s=5.0)
        done = subprocess.run(
            [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "fsck"],
            capture_output=True, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"OK" in done.stdout
        assert proxy.counters.slowdowns > 0 and proxy.counters.resets > 0
        # fsck takes as long as it takes: the client's read timeout (60 s, here 0.5 s)
        # does not cut it off
        monkeypatch.setattr(client_module, "READ_TIMEOUT_S", 0.5)
        proxy.faults = Faults(stall_rate=1.0, stall_s=5.0, methods=frozenset({"GET"}), max_faults=1)
        client = daemon.client()
        assert not client.call(FSCK).problems
        assert proxy.counters.stalls > 0
        client.close()
    finally:
        daemon.stop()


async def test_a_get_silent_past_a_quarter_of_its_deadline_is_hedged(
    tmp_path: Path, proxy: FaultProxy, proxied_bucket
) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    storage = chunkstore.open_chunk_storage(url, options, read_deadline_per_mib_s=8.0)
    payload = os.urandom(200 * KiB)
    storage.write("o", 0, payload)
    proxy.faults = Faults(stall_rate=1.0, stall_s=30.0, methods=frozenset({"GET"}), max_faults=1)
    requests_before = proxy.counters.requests
    started_s = time.monotonic()
    assert storage.read("o", 1000, 150 * KiB) == payload[1000 : 150 * KiB]
    waited_s = time.monotonic() - started_s
    assert proxy.counters.stalls == 1
    assert proxy.counters.requests - requests_before == 2, "one stalled GET and its twin"
    # the twin started after 2 s (a quarter of the 8 s deadline) and answered: the
    # deadline itself (8 s) was never reached
    assert waited_s < 8.0, f"{waited_s:.1f} s: the stalled GET was not hedged"


async def test_offload_and_offloaded_reads_through_faults(tmp_path: Path, proxy: FaultProxy, proxied_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", offload_url=url.replace("/chunks", "/longterm"), offload_options=options,
                          offload_deletion_lag_s=0.0, policy_interval_s=3600.0, tier2_read_timeout_s=0.5)
    payload = b"".join(record(i) for i in range(300))
    proxy.faults = Faults(slowdown_rate=0.1, reset_rate=0.05, stall_rate=0.05, stall_s=3.0)
    async with open_store(config) as store:
        await store.create("a")
        await store.append("a", payload)
        await store.seal("a")
        await store.flush("a")
        await store.offload("a")
        with trio.fail_after(60):
            while (status := await store.offload_status("a"))["state"] == "RUNNING":
                await trio.sleep(0.02)
        assert status["state"] == "SUCCESS", status
        assert status["offloaded_bytes"] == len(payload)
    assert proxy.counters.faults > 0
    proxy.faults = Faults(slowdown_rate=0.1, reset_rate=0.05, stall_rate=0.1, stall_s=3.0, methods=frozenset({"GET"}))
    async with open_store(config) as store:  # cold: index objects and blocks from S3
        assert all(c.offload_hot_deleted for c in await store.chunks_of(store._segment("a")))
        assert await store.read("a") == payload
        assert not (await fsck(store)).problems


async def test_a_stalled_put_holds_only_its_own_segment(tmp_path: Path, proxy: FaultProxy, proxied_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options)
    proxy.faults = Faults(stall_rate=1.0, stall_s=4.0, methods=frozenset({"PUT"}), max_faults=1,
                          path_contains="/s0")  # a chunk's PUT, not the owner claim's
    async with open_store(config) as store, trio.open_nursery() as nursery:
        await store.create("stalled")
        await store.create("other")
        await store.append("stalled", record(0))
        nursery.start_soon(store.flush, "stalled")
        with trio.fail_after(10):
            while proxy.counters.stalls == 0:
                await trio.sleep(0.01)
        await store.append("other", record(1))
        await store.flush("other")  # while the other segment's PUT hangs
        assert (await store.stat("other")).flushed_length == len(record(1))
        assert (await store.stat("stalled")).flushed_length == 0, "the stall ended first: the test shows nothing"
    async with open_store(config) as store:
        assert await store.read("stalled") == record(0)


async def test_policy_offload_resumes_on_its_own_after_an_outage(tmp_path: Path, proxy: FaultProxy, proxied_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = proxied_bucket
    config = small_config(tmp_path / "d", offload_url=url.replace("/chunks", "/longterm"), offload_options=options,
                          offload_deletion_lag_s=0.0, policy_interval_s=0.2)
    payload = b"".join(record(i) for i in range(100))
    async with open_store(config) as store:
        await store.mkdir("logs")
        await store.create("logs/a")
        await store.append("logs/a", payload)
        await store.flush("logs/a")
        proxy.outage(2)
        await store.set_policy("logs", {"offload_after_s": 0})
        await store.seal("logs/a")
        with trio.fail_after(60):
            while (await store.offload_status("logs/a"))["offloaded_bytes"] < len(payload):
                await trio.sleep(0.05)
        assert proxy.counters.refused > 0
    async with open_store(config) as store:
        assert all(c.location for c in await store.chunks_of(store._segment("logs/a")))
        assert await store.read("logs/a") == payload


def test_reads_are_retried_in_one_place_only(proxy: FaultProxy, proxied_bucket, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(chunkstore, "READ_RETRY_ATTEMPTS", 3)
    url, options = proxied_bucket
    # a 20 s deadline: no hedge (at 5 s) can fire, so every request is an attempt
    storage = chunkstore.open_chunk_storage(url, options, read_deadline_per_mib_s=20.0)
    storage.write("o", 0, b"x" * 1000)
    proxy.faults = Faults(slowdown_rate=1.0, methods=frozenset({"GET", "HEAD"}))
    before = proxy.counters.requests
    with pytest.raises(Tier2Error, match="after 3 attempts: .*reduce your request rate"):
        storage.read("o", 0, 1000)
    assert proxy.counters.requests - before == 3, "botocore or s3fs retried the read as well"
    before = proxy.counters.requests
    with pytest.raises(Tier2Error, match="after 3 attempts"):
        storage.stat("o")
    assert proxy.counters.requests - before == 3
