"""The batch job: the same counts per window and kind as ``event_counts.py``, over the
whole history under ``tierfs://events/`` (sealed and offloaded segments included), into
``tierfs://results/history``. With ``--s3-endpoint`` (and the usual ``AWS_*`` variables)
the executors read offloaded chunks from S3 themselves instead of through the daemon.

    spark-submit history.py [--window "1 minute"] [--s3-endpoint URL]
"""

from __future__ import annotations

import argparse
import json
import os

from event_counts import EVENT_SCHEMA, counts_per_window
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tierfs.spark.loopback import local_spark_defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--s3-endpoint", help="S3 endpoint of the offloaded chunks (executors read them directly)")
    args = parser.parse_args()

    local_spark_defaults()
    spark = (SparkSession.builder.appName("tierfs-history").config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4")  # Spark's 200 is for big data; a stream's state keeps it
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    read = spark.read.format("tierfs").option("format", "json").schema(EVENT_SCHEMA)
    if args.s3_endpoint:
        read = read.option("chunk_storage_options", json.dumps({
            "endpoint_url": args.s3_endpoint, "key": os.environ.get("AWS_ACCESS_KEY_ID"),
            "secret": os.environ.get("AWS_SECRET_ACCESS_KEY")}))
    events = read.load("tierfs://events/").withColumn("event_time", F.timestamp_seconds("ts"))
    counts = counts_per_window(events, args.window).cache()
    counts.write.format("tierfs").mode("append").save("tierfs://results/history")
    total = counts.agg(F.sum("events")).first()[0]
    print(f"[history] {total} events in {counts.count()} (window, kind) rows -> tierfs://results/history", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
