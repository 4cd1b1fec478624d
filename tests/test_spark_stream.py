"""Spark Structured Streaming over tierfs on local[2]: readStream follows appends and new
segments, offsets stop at whole records, a restarted query resumes from its checkpoint,
and writeStream into tierfs lands every micro-batch exactly once, even when a batch is
replayed after its commit (the driver died before recording it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tierfs.testing.harness import Daemon, start_daemon

KiB = 1 << 10


@pytest.fixture(scope="module")
def sdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"TIERFS_FLUSH_INTERVAL_S": "0.2", "TIERFS_MAX_CHUNK_BYTES": str(64 * KiB),
           "TIERFS_MAX_FLUSH_BYTES": str(32 * KiB)}
    running = start_daemon(tmp_path_factory.mktemp("stream") / "data", env=env)
    yield running
    running.stop()


def _copy_stream(spark: Any, daemon: Daemon, source: str, target: str, checkpoint: Path) -> None:
    """Run ``source`` -> ``target`` (JSON rows) once with trigger(availableNow=True)."""
    frame = (spark.readStream.format("tierfs").option("data_dir", str(daemon.data_dir))
             .option("partition_bytes", str(48 * KiB)).load(source))
    query = (frame.writeStream.format("tierfs").option("data_dir", str(daemon.data_dir))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(target))
    assert query.awaitTermination(180)
    assert query.exception() is None


def _rows(daemon: Daemon, target: str) -> list[tuple[str, int, str]]:
    client = daemon.client()
    try:
        data = client.read(target)
    finally:
        client.close()
    return [(r["path"], r["offset"], r["value"]) for r in map(json.loads, data.splitlines())]


def test_stream_resumes_from_its_checkpoint_without_loss_or_duplicates(
    spark: Any, sdaemon: Daemon, tmp_path: Path
) -> None:
    client = sdaemon.client()
    client.create("s1/a", parents=True)
    first = [f"a{i:04d} " + "x" * (i % 97) for i in range(1500)]
    body = "".join(line + "\n" for line in first).encode()
    for start in range(0, len(body), 5 * KiB):
        client.append("s1/a", body[start : start + 5 * KiB])
    client.append("s1/a", b"par")  # a record without its newline yet: not handed out
    client.op("flush", path="s1/a")
    checkpoint = tmp_path / "checkpoint"

    _copy_stream(spark, sdaemon, "tierfs://s1/", "out1/copy", checkpoint)
    got = _rows(sdaemon, "out1/copy")
    assert sorted(value for _, _, value in got) == sorted(first)
    offsets = {value: offset for _, offset, value in got}
    assert offsets[first[10]] == body.index(first[10].encode() + b"\n")

    client.append("s1/a", b"tial\nsecond round\n")  # completes "partial"
    client.create("s1/b")  # a new segment under the directory
    client.append("s1/b", b"b one\nb two\n")
    client.create("s1/_scratch")  # names starting with _ are skipped
    client.append("s1/_scratch", b"never read\n")
    _copy_stream(spark, sdaemon, "tierfs://s1/", "out1/copy", checkpoint)
    got = _rows(sdaemon, "out1/copy")
    expected = [*first, "partial", "second round", "b one", "b two"]
    assert sorted(value for _, _, value in got) == sorted(expected)
    assert {path for path, _, _ in got} == {"s1/a", "s1/b"}

    # The driver dies after the last batch reached tierfs but before Spark recorded
    # it: on restart Spark runs that batch again; tierfs refuses it (already committed).
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    appended_before = client.metrics()["tierfs_appended_bytes_total"]
    _copy_stream(spark, sdaemon, "tierfs://s1/", "out1/copy", checkpoint)
    assert client.metrics()["tierfs_appended_bytes_total"] > appended_before  # the batch did run again
    assert sorted(value for _, _, value in _rows(sdaemon, "out1/copy")) == sorted(expected)
    assert [entry.name for entry in client.ls("out1")] == ["out1/copy"]  # no transaction left
    client.close()


def test_stream_picks_up_appends_while_running(spark: Any, sdaemon: Daemon) -> None:
    client = sdaemon.client()
    client.create("s2/live", parents=True)
    frame = (spark.readStream.format("tierfs").option("data_dir", str(sdaemon.data_dir))
             .option("starting", "earliest").load("tierfs://s2/live"))
    query = (frame.writeStream.format("memory").queryName("live_lines")
             .trigger(processingTime="500 milliseconds").start())
    try:
        sent: list[str] = []
        for round_number in range(3):
            lines = [f"r{round_number}-{i}" for i in range(50)]
            client.append("s2/live", "".join(line + "\n" for line in lines).encode())
            sent += lines
            deadline = time.monotonic() + 60
            while True:
                seen = [row.value for row in spark.sql("SELECT value FROM live_lines").collect()]
                if len(seen) >= len(sent) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert sorted(seen) == sorted(sent)
    finally:
        query.stop()
        client.close()


def test_stream_options_are_checked(spark: Any, sdaemon: Daemon) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from tierfs.contracts.errors import InvalidArgumentError
    from tierfs.spark.stream import TierStreamReader

    lines = StructType([StructField("value", StringType())])
    with pytest.raises(InvalidArgumentError, match="starting"):
        TierStreamReader({"path": "x", "starting": "yesterday"}, lines)
    with pytest.raises(InvalidArgumentError, match="format"):
        TierStreamReader({"path": "x", "format": "csv"}, lines)
    with pytest.raises(InvalidArgumentError, match="reads the columns"):
        TierStreamReader({"path": "x"}, StructType([StructField("n", LongType())]))
