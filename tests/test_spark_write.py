"""Exactly-once Spark writes into tierfs on local[2] (up to 4 attempts per task): a task
that fails after writing part of its rows is retried and its partial transaction
segment never reaches the target; an aborted job leaves the target as it was; nothing
is left in ``_tierfs_tx`` but tombstones, which later jobs sweep."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tierfs.testing.harness import Daemon, start_daemon

PAD = "x" * 3000  # ~3 KiB rows: a task appends (1 MiB buffers) well before it fails


@pytest.fixture(scope="module")
def sdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    running = start_daemon(tmp_path_factory.mktemp("write") / "data")
    yield running
    running.stop()


def _frame(spark: Any, fail_at: int, always: bool) -> Any:
    """Ids 0..3999 in 4 partitions with a payload; the row ``fail_at`` raises in the
    first attempt of its task (or in every attempt with ``always``)."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    @udf("string", useArrow=False)  # a plain Python UDF (useArrow=None makes PySpark warn about the hints)
    def payload(i: int) -> str:
        context = TaskContext.get()
        if i == fail_at and (always or context.attemptNumber() == 0):
            raise RuntimeError(f"injected failure at row {i}")
        return f"{i:06d}{PAD}"

    return spark.range(0, 4000, 1, 4).withColumn("payload", payload("id"))


def _transactions_left(client: Any, directory: str) -> list[str]:
    """What is under ``<directory>/_tierfs_tx`` besides tombstones (empty sealed
    segments that keep late task attempts out)."""
    from tierfs.contracts.reports.info import SegmentInfo

    try:
        entries = client.ls(f"{directory}/_tierfs_tx")
    except FileNotFoundError:
        return []
    return [e.name for e in entries if not (isinstance(e, SegmentInfo) and e.sealed and e.length == 0)]


def _appended(daemon: Daemon) -> float:
    client = daemon.client()
    try:
        return client.metrics()["tierfs_appended_bytes_total"]
    finally:
        client.close()


@pytest.fixture
def small_batches(spark: Any) -> Iterator[None]:
    """Rows reach the writer 100 at a time (not 10,000), so a task fails mid-write."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "100")
    yield
    spark.conf.set(key, old)


def test_a_failed_task_is_retried_and_its_partial_rows_never_land(
    spark: Any, sdaemon: Daemon, small_batches: None
) -> None:
    before = _appended(sdaemon)
    (_frame(spark, fail_at=1900, always=False).write.format("tierfs").mode("append")
     .option("data_dir", str(sdaemon.data_dir)).save("tierfs://out/result"))
    client = sdaemon.client()
    data = client.read("out/result")
    rows = [json.loads(line) for line in data.splitlines()]
    assert sorted(r["id"] for r in rows) == list(range(4000))  # each row exactly once
    assert all(r["payload"] == f"{r['id']:06d}{PAD}" for r in rows)
    assert [r["id"] for r in rows] == list(range(4000))  # partitions land in order
    # the failed attempt did write (at least one 1 MiB append) before it failed
    assert _appended(sdaemon) - before >= len(data) + (1 << 20)
    assert _transactions_left(client, "out") == []

    (_frame(spark, fail_at=-1, always=False).limit(10).write.format("tierfs").mode("append")
     .option("data_dir", str(sdaemon.data_dir)).save("tierfs://out/result"))
    assert len(client.read("out/result").splitlines()) == 4010  # a second job appends
    client.close()


def test_an_aborted_job_leaves_the_target_unchanged(
    spark: Any, sdaemon: Daemon, small_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tierfs.spark.write import TierWriter

    client = sdaemon.client()
    client.create("keep/result", parents=True)
    client.append("keep/result", b'{"id": -1}\n')
    before = _appended(sdaemon)
    with pytest.raises(Exception, match="injected failure"):
        (_frame(spark, fail_at=2500, always=True).write.format("tierfs").mode("append")
         .option("data_dir", str(sdaemon.data_dir)).save("tierfs://keep/result"))
    assert _appended(sdaemon) - before > 1 << 20  # tasks wrote transaction segments
    assert client.read("keep/result") == b'{"id": -1}\n'
    # attempts Spark was still killing when it aborted could not add segments afterwards
    time.sleep(3)
    assert _transactions_left(client, "keep") == []
    assert client.read("keep/result") == b'{"id": -1}\n'
    # a later job next to the same target sweeps tombstones older than the TTL
    monkeypatch.setattr(TierWriter, "TOMBSTONE_TTL_S", 0.0)
    TierWriter({"data_dir": str(sdaemon.data_dir), "path": "keep/result"}, _frame(spark, -1, False).schema,
               False).abort([])
    assert [e.name for e in client.ls("keep")] == ["keep/result"]
    client.close()


def test_lines_and_raw_formats_and_refusals(spark: Any, sdaemon: Daemon) -> None:
    from tierfs.contracts.errors import InvalidArgumentError
    from tierfs.spark.write import TierWriter

    options = {"data_dir": str(sdaemon.data_dir)}
    lines = spark.createDataFrame([(f"line {i}",) for i in range(100)], "value string").repartition(3)
    lines.write.format("tierfs").mode("append").options(format="lines", **options).save("tierfs://fmt/lines")
    blobs = spark.createDataFrame([(bytes([i]) * 10,) for i in range(20)], "value binary").coalesce(1)
    blobs.write.format("tierfs").mode("append").options(format="raw", **options).save("tierfs://fmt/raw")
    client = sdaemon.client()
    assert sorted(client.read("fmt/lines").decode().splitlines()) == sorted(f"line {i}" for i in range(100))
    assert client.read("fmt/raw") == b"".join(bytes([i]) * 10 for i in range(20))
    back = spark.read.format("tierfs").options(**options).load("tierfs://fmt/lines")
    assert back.count() == 100

    with pytest.raises(Exception, match="append-only"):
        lines.write.format("tierfs").mode("overwrite").options(**options).save("tierfs://fmt/lines")
    with pytest.raises(InvalidArgumentError, match="exactly one string column"):
        TierWriter({**options, "path": "fmt/x", "format": "lines"}, _frame(spark, -1, False).schema, False)
    client.op("mkdir", path="fmt/dir")
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        TierWriter({**options, "path": "fmt/dir"}, lines.schema, False)
    client.op("seal", path="fmt/raw")
    with pytest.raises(InvalidArgumentError, match="sealed"):
        TierWriter({**options, "path": "fmt/raw", "format": "raw"}, blobs.schema, False)
    assert client.read("fmt/raw") == b"".join(bytes([i]) * 10 for i in range(20))
    client.close()


def test_a_plain_save_says_which_mode_to_use(spark: Any, sdaemon: Daemon) -> None:
    """Spark refuses its default mode (ErrorIfExists) for Python data sources before any
    of tierfs runs; the message names Append, and Overwrite names mode('append')."""
    options = {"data_dir": str(sdaemon.data_dir)}
    frame = spark.createDataFrame([(1, "a")], ["id", "name"])
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE") as refused:
        frame.write.format("tierfs").options(**options).save("tierfs://plain/new")
    assert '"Append"' in str(refused.value)
    with pytest.raises(Exception, match=r"append-only: use mode\('append'\)"):
        frame.write.format("tierfs").mode("overwrite").options(**options).save("tierfs://plain/new")
    frame.write.format("tierfs").mode("append").options(**options).save("tierfs://plain/new")
    assert sdaemon.client().read("plain/new").decode().strip() == '{"id":1,"name":"a"}'


def test_an_append_refused_for_a_full_backlog_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused append wrote nothing: it is sent again, with pauses that double up to a
    second, until the daemon takes it; after BACKLOG_WAIT_S of refusals it fails."""
    from tierfs.contracts.errors import BacklogFullError
    from tierfs.spark import appends

    class Refusing:
        def __init__(self, refusals: int) -> None:
            self.refusals = refusals
            self.appended: list[bytes] = []

        def append_on_socket(self, name: str, data: bytes, writer: object = None) -> int:
            if self.refusals:
                self.refusals -= 1
                raise BacklogFullError(2 << 30, 1 << 30)
            self.appended.append(data)
            return 0

    pauses: list[float] = []
    monkeypatch.setattr(appends.time, "sleep", pauses.append)
    client = Refusing(refusals=7)
    appends.append_when_there_is_room(client, "tx/p0", b"rows\n")  # type: ignore[arg-type]
    assert client.appended == [b"rows\n"]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    monkeypatch.setattr(appends, "BACKLOG_WAIT_S", 2.0)
    with pytest.raises(BacklogFullError):
        appends.append_when_there_is_room(Refusing(refusals=100), "tx/p0", b"rows\n")  # type: ignore[arg-type]


def test_pipelined_appends_keep_their_order_and_stop_at_the_first_failure() -> None:
    """A task's appends leave from one thread in the order given, at most
    APPENDS_WAITING waiting; the first failure reaches the task and nothing after it
    is sent."""
    import threading

    from tierfs.spark.appends import APPENDS_WAITING, PipelinedAppends

    class Slow:
        def __init__(self, fail_at: int) -> None:
            self.created: list[str] = []
            self.appended: list[bytes] = []
            self.gate = threading.Event()
            self.fail_at = fail_at

        def create(self, name: str, durability: str, parents: bool) -> None:
            self.created.append(name)

        def close_append_connection(self) -> None:
            """None to close: this client has no connection."""

        def append_on_socket(self, name: str, data: bytes, writer: object = None) -> int:
            self.gate.wait()
            if len(self.appended) == self.fail_at:
                raise OSError("daemon gone")
            self.appended.append(data)
            return 0

    client = Slow(fail_at=-1)
    pipe = PipelinedAppends(client, "tx/p1")  # type: ignore[arg-type]
    sender = threading.Thread(target=lambda: [pipe.send(b"%d" % i) for i in range(10)])
    sender.start()
    sender.join(timeout=0.5)
    assert sender.is_alive()  # blocked: one append in flight, APPENDS_WAITING waiting
    assert APPENDS_WAITING < 10
    client.gate.set()
    sender.join(timeout=10)
    assert pipe.finish() is True
    assert client.created == ["tx/p1"] and client.appended == [b"%d" % i for i in range(10)]
    assert pipe.sent_bytes == 10

    failing = Slow(fail_at=3)
    failing.gate.set()
    pipe = PipelinedAppends(failing, "tx/p2")  # type: ignore[arg-type]
    with pytest.raises(OSError, match="daemon gone"):
        for i in range(100):
            pipe.send(b"%d" % i)
        pipe.finish()
    pipe.stop()
    assert failing.appended == [b"0", b"1", b"2"]
    assert PipelinedAppends(Slow(-1), "tx/p3").finish() is False  # type: ignore[arg-type]
