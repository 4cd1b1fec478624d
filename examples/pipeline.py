"""The example data pipeline, end to end on embedded defaults (``./dev.sh demo``).

1. A local S3 server (moto, on 127.0.0.1) plays the long-term store, and tierfs runs as
   a daemon with its FUSE mount (``tierfs mount``) offloading to it.
2. Two producers append JSON events while the pipeline runs: one through fsspec
   (``tierfs://events/web``), one through the mount (``<mount>/events/mobile``, with
   ``fsync``).
3. A Spark Structured Streaming job follows ``tierfs://events/`` (both segments), counts
   events and sums amounts per minute of event time and kind, and writes the closed
   windows back into tierfs (``tierfs://results/per_minute``), exactly once.
4. The event segments are sealed and offloaded to S3 (their local copies deleted), and a
   Spark batch job reads the whole history straight from the S3 objects.
5. Every figure is checked against the events the producers sent; any difference makes
   the pipeline exit with status 1.

Without ``/dev/fuse`` the mount is skipped and both producers use fsspec.

    .venv/bin/python examples/pipeline.py [WORK_DIR]     (default: ./pipeline-data)
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import fsspec

EVENTS = 12_000  # per producer
MINUTES = 6  # of simulated event time
START_S = 1_795_000_000 - 1_795_000_000 % 60  # a whole minute (2026-11-18 11:06 UTC)
KINDS = ("view", "click", "buy")
SCHEMA = "path string, offset long, ts double, user string, kind string, amount double"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "pipeline", "AWS_SECRET_ACCESS_KEY": "pipeline",
                  "AWS_DEFAULT_REGION": "us-east-1"}


def say(text: str) -> None:
    print(f"[pipeline] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the local S3 server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def tierfs_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", *args], capture_output=True,
                          text=True, check=check, timeout=300)


def make_events(producer: str, seed: int) -> list[dict[str, Any]]:
    """Events in event-time order across MINUTES minutes, then one closing event two
    minutes later: it moves the stream's watermark past the last real minute (its own
    window never closes, so it is never written)."""
    rng = random.Random(seed)
    events = []
    for i in range(EVENTS):
        ts = START_S + (i + rng.random()) * MINUTES * 60 / EVENTS
        kind = rng.choices(KINDS, weights=(70, 25, 5))[0]
        amount = round(rng.uniform(1, 200), 2) if kind == "buy" else 0.0
        events.append({"ts": round(ts, 3), "user": f"{producer}-u{rng.randrange(300)}", "kind": kind,
                       "amount": amount})
    events.append({"ts": START_S + (MINUTES + 2) * 60, "user": producer, "kind": "end", "amount": 0.0})
    return events


def lines(events: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)


def produce_through_fsspec(events: list[dict[str, Any]], rounds: int) -> None:
    with fsspec.open("tierfs://events/web", "ab") as f:
        step = -(-len(events) // rounds)
        for start in range(0, len(events), step):
            f.write(lines(events[start : start + step]))
            f.flush()  # one atomic append per round
            time.sleep(0.5)


def produce_through_the_mount(path: Path, events: list[dict[str, Any]], rounds: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab", buffering=0) as f:
        step = -(-len(events) // rounds)
        for start in range(0, len(events), step):
            f.write(lines(events[start : start + step]))
            os.fsync(f.fileno())
            time.sleep(0.5)


def expected_per_minute(events: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, float]]:
    counts: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in events:
        if event["kind"] == "end":
            continue
        minute = time.strftime("%Y-%m-%d %H:%M", time.gmtime(int(event["ts"] // 60 * 60)))
        counts[(minute, event["kind"])][0] += 1
        counts[(minute, event["kind"])][1] += event["amount"]
    return {key: (int(n), round(total, 2)) for key, (n, total) in counts.items()}


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from tierfs.spark import register
    from tierfs.spark.loopback import local_spark_defaults

    local_spark_defaults()  # loopback (a host whose name does not resolve), this python on the workers
    spark = (SparkSession.builder.master("local[2]").appName("tierfs-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_streaming_job(spark: Any, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    events = spark.readStream.format("tierfs").option("format", "json").schema(SCHEMA).load("tierfs://events/")
    # no filter on "end" here: Spark would push it below the watermark, which would then
    # never see the closing events
    per_minute = (events.withColumn("event_time", F.timestamp_seconds("ts"))
                  .withWatermark("event_time", "30 seconds")
                  .groupBy(F.window("event_time", "1 minute"), "kind")
                  .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
                  .select(F.date_format("window.start", "yyyy-MM-dd HH:mm").alias("minute"), "kind",
                          "events", "amount"))
    return (per_minute.writeStream.format("tierfs").outputMode("append")
            .option("checkpointLocation", str(checkpoint)).trigger(processingTime="2 seconds")
            .start("tierfs://results/per_minute"))


def read_results(client: Any) -> dict[tuple[str, str], tuple[int, float]]:
    try:
        data = client.read("results/per_minute")
    except Exception:  # not created yet
        return {}
    rows = [json.loads(line) for line in data.splitlines()]
    results = {(r["minute"], r["kind"]): (r["events"], r["amount"]) for r in rows}
    if len(results) != len(rows):
        raise SystemExit("a window was written twice")
    return results


def offload_events(client: Any) -> None:
    for name in ("events/web", "events/mobile"):
        client.op("seal", path=name)
        client.op("flush", path=name)
        client.op("offload", path=name)
        while (status := client.op("offload_status", path=name))["state"] == "RUNNING":
            time.sleep(0.2)
        if status["state"] != "SUCCESS":
            raise SystemExit(f"offload of {name} failed: {status}")
        urls = [entry["url"] for entry in client.layout(name)]
        say(f"offloaded {name}: {status['offloaded_bytes']} bytes in {len(urls)} chunk(s), "
            f"now at {urls[0].rsplit('/', 1)[0]}/ (local copies deleted)")


def main(work: Path) -> int:
    from tierfs.remote.client import TierClient, discover_url

    shutil.rmtree(work, ignore_errors=True)
    data_dir, mountpoint, checkpoint = work / "store", work / "mnt", work / "checkpoint"
    mountpoint.mkdir(parents=True)
    os.environ.update(S3_CREDENTIALS)
    os.environ["TIERFS_DATA_DIR"] = str(data_dir)
    with local_s3() as endpoint:
        bucket = "tierfs-pipeline"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        common = ["--data-dir", str(data_dir), "--offload-to", f"s3://{bucket}/longterm",
                  "--offload-endpoint-url", endpoint, "--deletion-lag", "0"]
        with contextlib.ExitStack() as cleanup:  # every exit path stops what it started
            mounted = (Path("/dev/fuse").exists()
                       and tierfs_cli(*common, "mount", str(mountpoint), check=False).returncode == 0)
            if mounted:
                cleanup.callback(tierfs_cli, "umount", str(mountpoint), check=False)
            else:
                say("no FUSE here: serving without a mount, both producers use fsspec")
                server = subprocess.Popen([sys.executable, "-m", "tierfs.cli", *common, "serve"])
                cleanup.callback(stop_process, server)
                deadline = time.monotonic() + 30
                while not Path(discover_url(str(data_dir))[len("unix://"):]).exists():
                    if time.monotonic() > deadline:
                        raise SystemExit("the tierfs daemon did not start")
                    time.sleep(0.1)
            say(f"tierfs at {data_dir}" + (f", mounted at {mountpoint}" if mounted else "") +
                f"; long-term store s3://{bucket} on {endpoint}")
            client = TierClient()
            cleanup.callback(client.close)
            spark = spark_session()
            cleanup.callback(spark.stop)
            return run(spark, client, mountpoint if mounted else None, checkpoint, endpoint)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run(spark: Any, client: Any, mountpoint: Path | None, checkpoint: Path, endpoint: str) -> int:
    from pyspark.sql import functions as F

    web, mobile = make_events("web", 1), make_events("mobile", 2)
    client.op("mkdir", path="events", parents=True)
    client.create("events/mobile")  # both segments exist before the stream starts
    client.create("events/web")
    query = start_streaming_job(spark, checkpoint)
    say("streaming job started: per-minute counts -> tierfs://results/per_minute")
    producers = [threading.Thread(target=produce_through_fsspec, args=(web, 8))]
    if mountpoint is not None:
        producers.append(threading.Thread(target=produce_through_the_mount,
                                          args=(mountpoint / "events" / "mobile", mobile, 8)))
    else:
        producers.append(threading.Thread(target=lambda: client.append("events/mobile", lines(mobile))))
    started = time.monotonic()
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    say(f"producers done: {len(web) + len(mobile)} events in {time.monotonic() - started:.1f} s")

    expected = expected_per_minute(web + mobile)
    deadline = time.monotonic() + 180
    while (results := read_results(client)) != expected and time.monotonic() < deadline:
        if query.exception() is not None:
            raise SystemExit(f"the streaming job failed: {query.exception()}")
        time.sleep(1)
    query.stop()
    say("per-minute results written by the streaming job:")
    for (minute, kind), (events, amount) in sorted(results.items()):
        print(f"    {minute}  {kind:5}  {events:6} events  {amount:10.2f}")
    if results != expected:
        say(f"MISMATCH: expected {len(expected)} windows, got {len(results)}")
        return 1

    offload_events(client)
    storage = json.dumps({"endpoint_url": endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]})
    gets_before = client.metrics()["tierfs_tier2_gets_total"]
    history = (spark.read.format("tierfs").option("format", "json").schema(SCHEMA)
               .option("chunk_storage_options", storage).load("tierfs://events/")
               .where(F.col("kind") != "end"))
    batch = {(r.minute, r.kind): (r.events, round(r.amount, 2)) for r in history
             .groupBy(F.date_format(F.timestamp_seconds(F.floor(F.col("ts") / 60) * 60), "yyyy-MM-dd HH:mm")
                      .alias("minute"), "kind")
             .agg(F.count("*").alias("events"), F.sum("amount").alias("amount")).collect()}
    daemon_gets = client.metrics()["tierfs_tier2_gets_total"] - gets_before
    say(f"batch job over the offloaded history: {sum(n for n, _ in batch.values())} events, "
        f"{len(batch)} (minute, kind) windows; executors read S3 directly "
        f"(the daemon fetched {daemon_gets:.0f} blocks)")
    if batch != expected:
        say("MISMATCH between the batch job and the events sent")
        return 1
    say("OK: streaming results and the batch over S3 both match every event sent")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "pipeline-data"))
