"""The PySpark data source on local[2] (the session-wide ``spark`` fixture): batch reads equal the segment bytes split into
records, across chunk and partition boundaries, the long-term store and the unflushed
tail; executors read chunks directly."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tierfs.testing.harness import Daemon, start_daemon

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="Spark needs a Java runtime (./dev.sh test installs one)")

KiB = 1 << 10


@pytest.fixture(scope="module")
def sdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"TIERFS_FLUSH_INTERVAL_S": "3600", "TIERFS_FLUSH_BYTES": str(64 << 20),
           "TIERFS_MAX_CHUNK_BYTES": str(256 * KiB), "TIERFS_MAX_FLUSH_BYTES": str(128 * KiB)}
    running = start_daemon(tmp_path_factory.mktemp("spark") / "data", env=env)
    yield running
    running.stop()


def _lines(rng: random.Random, count: int) -> list[bytes]:
    return [json.dumps({"user": f"u{rng.randrange(50)}", "n": i,
                        "pad": "x" * rng.randrange(0, 3000)}).encode() for i in range(count)]


def _expected(data: bytes) -> list[tuple[int, bytes]]:
    records, position = [], 0
    for line in data.split(b"\n"):
        records.append((position, line))
        position += len(line) + 1
    if data.endswith(b"\n"):
        records.pop()
    return records


def test_batch_lines_and_json_across_chunks_partitions_and_the_tail(spark: Any, sdaemon: Daemon) -> None:
    client = sdaemon.client()
    rng = random.Random(7)
    client.create("logs/a", parents=True)
    flushed = b"".join(line + b"\n" for line in _lines(rng, 800))
    for start in range(0, len(flushed), 10 * KiB):  # appends cut records anywhere
        client.append("logs/a", flushed[start : start + 10 * KiB])
    client.op("flush", path="logs/a")
    tail = b"".join(line + b"\n" for line in _lines(rng, 30)) + b'{"user": "last", "n": -1, "pad": ""}'
    client.append("logs/a", tail)
    client.create("logs/b")
    client.append("logs/b", b'{"user": "b", "n": 0, "pad": ""}\n')
    layout = client.layout("logs/a")
    assert len(layout) >= 4 and client.stat("logs/a").flushed_length < client.stat("logs/a").length
    data = flushed + tail

    frame = (spark.read.format("tierfs").option("data_dir", str(sdaemon.data_dir))
             .option("partition_bytes", str(100 * KiB)).load("tierfs://logs/"))
    assert frame.rdd.getNumPartitions() > 4
    rows = frame.collect()
    got_a = sorted((r.offset, r.value.encode()) for r in rows if r.path == "logs/a")
    assert got_a == _expected(data)
    assert [(r.offset, r.value) for r in rows if r.path == "logs/b"] == [(0, '{"user": "b", "n": 0, "pad": ""}')]

    typed = (spark.read.format("tierfs").option("format", "json").option("data_dir", str(sdaemon.data_dir))
             .option("partition_bytes", str(64 * KiB))
             .schema("path string, offset long, user string, n long").load("tierfs://logs/a"))
    counts = {r.user: r.c for r in typed.groupBy("user").count().withColumnRenamed("count", "c").collect()}
    expected_users = [json.loads(line)["user"] for _, line in _expected(data)]
    assert counts == {u: expected_users.count(u) for u in set(expected_users)}
    assert typed.agg({"n": "sum"}).collect()[0][0] == sum(json.loads(line)["n"] for _, line in _expected(data))
    client.close()


def test_batch_raw_blocks(spark: Any, sdaemon: Daemon) -> None:
    client = sdaemon.client()
    payload = os.urandom(700 * KiB + 3)
    client.create("blobs/b1", parents=True)
    client.append("blobs/b1", payload[: 500 * KiB])
    client.op("flush", path="blobs/b1")
    client.append("blobs/b1", payload[500 * KiB :])
    rows = (spark.read.format("tierfs").option("format", "raw").option("block_size", str(64 * KiB))
            .option("partition_bytes", str(128 * KiB)).option("data_dir", str(sdaemon.data_dir))
            .load("tierfs://blobs/b1").orderBy("offset").collect())
    assert [r.offset for r in rows] == list(range(0, len(payload), 64 * KiB))
    assert b"".join(bytes(r.value) for r in rows) == payload
    client.close()


def test_partition_planning_never_splits_or_repeats_a_byte() -> None:
    from tierfs.spark.read import plan_partitions, plan_ranges

    layout = [{"start": 0, "end": 300}, {"start": 300, "end": 350}, {"start": 350, "end": 1000}]
    ranges = plan_ranges("s", layout, 0, 1200, 200)
    assert ranges[0].start == 0 and ranges[-1].end == 1200
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(r.end - r.start <= 200 or r.end == 1200 for r in ranges)
    small = plan_ranges("t", [], 0, 10, 200) + plan_ranges("u", [], 0, 20, 200)
    assert len(plan_partitions(small, 200)) == 1
    truncated = plan_ranges("v", [{"start": 400, "end": 800}], 400, 900, 1000, 400)
    assert [(r.start, r.end) for r in truncated] == [(400, 900)]
    middle = plan_ranges("w", layout, 320, 700, 200)  # a micro-batch's slice
    assert middle[0].start == 320 and middle[-1].end == 700 and all(r.length == 700 for r in middle)
    assert all(a.end == b.start and b.end - b.start <= 200 for a, b in zip(middle, middle[1:], strict=False))


def test_batch_reads_history_offloaded_to_s3(
    spark: Any, s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """After offload (hot copies deleted), executors read the long-term objects: directly
    from S3 when given storage options (the daemon issues no GET), else via the daemon."""
    url, options = s3_bucket
    env = {"TIERFS_OFFLOAD_TO": f"s3://{url.split('/')[2]}/longterm",
           "TIERFS_OFFLOAD_ENDPOINT_URL": str(options["endpoint_url"]),
           "TIERFS_OFFLOAD_DELETION_LAG_S": "0", "TIERFS_FLUSH_INTERVAL_S": "3600",
           "TIERFS_MAX_CHUNK_BYTES": str(256 * KiB), "TIERFS_MAX_FLUSH_BYTES": str(128 * KiB)}
    daemon = start_daemon(tmp_path / "data", env=env)
    try:
        client = daemon.client()
        data = b"".join(line + b"\n" for line in _lines(random.Random(3), 500))
        client.create("hist/day1", parents=True)
        for start in range(0, len(data), 7 * KiB):
            client.append("hist/day1", data[start : start + 7 * KiB])
        client.op("seal", path="hist/day1")
        client.op("flush", path="hist/day1")
        client.op("offload", path="hist/day1")
        deadline = time.monotonic() + 60
        while client.op("offload_status", path="hist/day1")["state"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        layout = client.layout("hist/day1")
        assert len(layout) >= 3 and all(entry["url"].startswith("s3://") for entry in layout)
        assert not list((daemon.data_dir / "chunks").rglob("e*-c*"))  # hot copies deleted

        def read(**extra: str) -> list[tuple[int, bytes]]:
            frame = (spark.read.format("tierfs").option("data_dir", str(daemon.data_dir))
                     .option("partition_bytes", str(200 * KiB)))
            for key, value in extra.items():
                frame = frame.option(key, value)
            return sorted((r.offset, r.value.encode()) for r in frame.load("tierfs://hist/").collect())

        gets_before = client.metrics()["tierfs_tier2_gets_total"]
        # credentials in the options: executors do not inherit this test's environment
        direct = {**options, "key": "testing", "secret": "testing"}
        assert read(chunk_storage_options=json.dumps(direct)) == _expected(data)
        assert client.metrics()["tierfs_tier2_gets_total"] == gets_before  # the executors did the GETs
        assert read() == _expected(data)
        assert client.metrics()["tierfs_tier2_gets_total"] > gets_before  # through the daemon
        client.close()
    finally:
        daemon.stop()


def test_writes_from_another_thread_and_session_and_tierfs_errors_first(spark: Any, sdaemon: Daemon,
                                                                        tmp_path: Path) -> None:
    """format("tierfs") works from any Python thread and in a new session of the same
    application; a tierfs error reads as Spark's prefix, one frame and tierfs's line."""
    import threading

    from pyspark.errors import AnalysisException

    def write(session: Any, name: str) -> None:
        (session.createDataFrame([(name,)], "value string").write.format("tierfs").mode("append")
         .option("format", "lines").option("data_dir", str(sdaemon.data_dir)).save(f"tierfs://threads/{name}"))

    failures: list[BaseException] = []

    def in_thread() -> None:
        try:
            write(spark, "thread")
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            failures.append(e)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert not failures, failures
    write(spark.newSession(), "session")
    client = sdaemon.client()
    try:
        assert client.read("threads/thread") == b"thread\n"
        assert client.read("threads/session") == b"session\n"
    finally:
        client.close()

    with pytest.raises(AnalysisException) as raised:
        (spark.createDataFrame([("x",)], "value string").write.format("tierfs").mode("append")
         .option("data_dir", str(tmp_path / "no-daemon")).save("tierfs://x"))
    lines = str(raised.value).splitlines()
    assert lines[0].endswith("Traceback (most recent call last):"), lines
    assert lines[4].startswith("tierfs.contracts.errors.DaemonUnavailableError: no tierfs daemon at "), lines
    with pytest.raises(AnalysisException) as raised:
        spark.read.format("tierfs").option("data_dir", str(sdaemon.data_dir)).load("tierfs://no/such").collect()
    lines = str(raised.value).splitlines()
    assert lines[4].startswith("tierfs.contracts.errors.SegmentNotFoundError: "), lines
