"""The streaming job: events counted, and amounts summed, per window of event time and
kind, from every segment under ``tierfs://events/`` into ``tierfs://results/event_counts``
(JSON lines), exactly once. A window is written once it is closed: when the events seen
are WATERMARK past its end; later events for it are dropped, as Spark's watermarks do.

    spark-submit event_counts.py CHECKPOINT_DIR          (or: python event_counts.py ...)
        [--window "1 minute"] [--watermark "30 seconds"]

It runs until it is stopped (Ctrl-C or SIGTERM ends the query cleanly); started again
with the same CHECKPOINT_DIR, it goes on where it stopped, writing no window twice.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tierfs.spark.loopback import local_spark_defaults

EVENT_SCHEMA = "ts double, user string, kind string, amount double"


def counts_per_window(events: Any, window: str) -> Any:
    """(window start, kind) -> events, amount: the same for the stream and a batch."""
    return (events.groupBy(F.window("event_time", window), "kind")
            .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
            .select(F.date_format("window.start", "yyyy-MM-dd HH:mm:ss").alias("window"), "kind", "events", "amount"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--watermark", default="30 seconds")
    parser.add_argument("--trigger", default="2 seconds", help="how often a micro-batch starts")
    args = parser.parse_args()

    local_spark_defaults()  # for a local run: loopback, and this Python on the executors
    spark = (SparkSession.builder.appName("tierfs-event-counts")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4")  # Spark's 200 is for big data; a stream's state keeps it
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    events = (spark.readStream.format("tierfs").option("format", "json").schema(EVENT_SCHEMA)
              .load("tierfs://events/")
              .withColumn("event_time", F.timestamp_seconds("ts")).withWatermark("event_time", args.watermark))
    query = (counts_per_window(events, args.window).writeStream.format("tierfs").outputMode("append")
             .option("checkpointLocation", args.checkpoint).trigger(processingTime=args.trigger)
             .start("tierfs://results/event_counts"))
    print(f"[event_counts] streaming tierfs://events/ -> tierfs://results/event_counts "
          f"(windows of {args.window}, watermark {args.watermark})", flush=True)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        while query.isActive and not stopping:
            query.awaitTermination(1)
    except KeyboardInterrupt:
        pass
    finally:
        failure = query.exception()
        query.stop()
        spark.stop()
    if failure is not None:
        sys.exit(f"[event_counts] the query failed: {failure}")
    print("[event_counts] stopped", flush=True)


if __name__ == "__main__":
    main()
