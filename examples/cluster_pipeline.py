"""The example pipeline on a cluster, on one machine as several hosts
(``.venv/bin/python examples/cluster_pipeline.py [WORK_DIR]``).

1. A throw-away PostgreSQL (the metadata) and moto's S3 server (tier-2: the data) on
   127.0.0.1; three tierfs cluster daemons, each with its own data dir and port, share
   them: six segment containers, two per daemon.
2. A Spark standalone cluster: a master and two workers, separate processes started
   with ``spark-class`` from the PySpark install, bound to 127.0.0.1.
3. Two producers append JSON events through different daemons (``web/events`` through
   host 0, ``mobile/events`` through host 1), wherever those segments' owners are.
4. A Spark job on the cluster reads both (executors read the flushed chunks straight
   from S3, CRC-checked, and the tails from the owners through host 2), counts events
   and sums amounts per kind, and writes the result through tierfs
   (``results/per_kind``), exactly once.
5. One daemon is killed (-9); after failover the job runs again, through the survivors,
   and must give the same answer. Every figure is checked against what the producers
   sent: any difference exits with status 1.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline import S3_CREDENTIALS, free_port, local_s3  # noqa: E402

from tierfs.contracts.datadir import load_or_create_token  # noqa: E402
from tierfs.remote.client import TierClient  # noqa: E402
from tierfs.testing.cluster import Cluster  # noqa: E402
from tierfs.testing.postgres import PostgresServer  # noqa: E402

EVENTS = 3_000  # per producer
KINDS = ("view", "click", "buy")
SCHEMA = "ts double, user string, kind string, amount double"
BUCKET = "tierfs-cluster"


@contextlib.contextmanager
def spark_standalone(work: Path, workers: int = 2) -> Iterator[str]:
    """A Spark standalone master and ``workers`` workers (1 core each) on 127.0.0.1."""
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(work / "spark-logs"),
               PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = [subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port())],
        env=env, stdout=subprocess.DEVNULL, stderr=(work / "spark-master.log").open("w"))]
    try:
        for index in range(workers):
            worker_dir = work / f"spark-worker-{index}"
            worker_dir.mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()), "--work-dir", str(worker_dir)],
                env=env, stdout=subprocess.DEVNULL, stderr=(work / f"spark-worker-{index}.log").open("w")))
        yield master_url
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def spark_session(master_url: str) -> Any:
    from pyspark.sql import SparkSession

    from tierfs.spark import register

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(master_url).appName("tierfs-cluster-pipeline")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.executor.cores", "1")
             .config("spark.cores.max", "2").config("spark.executor.memory", "1g")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def produce(client: TierClient, name: str, seed: int, sent: list[dict[str, Any]]) -> None:
    rng = random.Random(seed)
    batch: list[bytes] = []
    for i in range(EVENTS):
        event = {"ts": 1_795_000_000 + i, "user": f"u{rng.randrange(50)}", "kind": rng.choice(KINDS),
                 "amount": round(rng.uniform(1, 100), 2)}
        sent.append(event)
        batch.append(json.dumps(event).encode() + b"\n")
        if len(batch) == 100:
            client.append(name, b"".join(batch))  # one atomic record of 100 lines
            batch.clear()
    if batch:
        client.append(name, b"".join(batch))


def run_job(spark: Any, url: str, token: str, storage: dict[str, Any], attempt: int,
            counted: tuple[list[str], list[str]]) -> dict[str, tuple[int, float]]:
    """The job, then its result read back; prints the tier-2 blocks the daemons fetched
    for the job itself (its reads and its write; not the read-back)."""
    from pyspark.sql import functions as F

    gets_before = tier2_gets(*counted)
    def load(path: str) -> Any:
        return (spark.read.format("tierfs").option("format", "json").option("url", url).option("token", token)
                .option("chunk_storage_options", json.dumps(storage)).schema(SCHEMA).load(path))

    events = load("tierfs://web/").unionByName(load("tierfs://mobile/"))
    per_kind = events.groupBy("kind").agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
    target = f"tierfs://results/per_kind-{attempt}"
    (per_kind.write.format("tierfs").option("url", url).option("token", token).mode("append").save(target))
    print(f"the daemons fetched {tier2_gets(*counted) - gets_before:.0f} blocks from tier-2 for the job "
          "(the executors read S3 themselves)", flush=True)
    client = TierClient(url, token)
    try:
        rows = [json.loads(line) for line in client.read(target[len("tierfs://"):]).splitlines()]
    finally:
        client.close()
    kinds = [row["kind"] for row in rows]
    if sorted(kinds) != sorted(set(kinds)):
        raise SystemExit(f"results written more than once: {rows}")
    return {row["kind"]: (row["events"], row["amount"]) for row in rows}


def tier2_gets(urls: list[str], tokens: list[str]) -> float:
    total = 0.0
    for url, token in zip(urls, tokens, strict=True):
        client = TierClient(url, token)
        try:
            total += client.metrics()["tierfs_tier2_gets_total"]
        finally:
            client.close()
    return total


def expected(sent: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    counts: dict[str, int] = collections.Counter(e["kind"] for e in sent)
    sums: dict[str, float] = collections.defaultdict(float)
    for e in sent:
        sums[e["kind"]] += e["amount"]
    return {kind: (counts[kind], round(sums[kind], 2)) for kind in counts}


def main(work: Path) -> int:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.environ.update(S3_CREDENTIALS)
    with PostgresServer() as postgres, local_s3() as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        cluster = Cluster(work / "hosts", postgres.url, f"s3://{BUCKET}/tier2", containers=6, lease_s=3.0,
                          extra=[f'tier2_endpoint_url = "{endpoint}"'])
        try:
            for index in range(3):
                cluster.start(index)
            owners = cluster.wait_balanced([0, 1, 2])
            print(f"3 daemons, containers: {owners}", flush=True)
            urls = [f"http://127.0.0.1:{cluster.ports[i]}" for i in range(3)]
            tokens = [load_or_create_token(cluster.data_dir(i)) for i in range(3)]
            clients = [TierClient(urls[i], tokens[i]) for i in range(2)]
            clients[0].create("web/events", parents=True)
            clients[1].create("mobile/events", parents=True)
            sent: list[dict[str, Any]] = []
            web: list[dict[str, Any]] = []
            mobile: list[dict[str, Any]] = []
            threads = [threading.Thread(target=produce, args=(clients[0], "web/events", 1, web)),
                       threading.Thread(target=produce, args=(clients[1], "mobile/events", 2, mobile))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            sent = web + mobile
            storage = {"endpoint_url": endpoint, "key": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                       "secret": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
            want = expected(sent)
            with spark_standalone(work) as master_url:
                spark = spark_session(master_url)
                try:
                    got = run_job(spark, urls[2], tokens[2], storage, 1, (urls, tokens))
                    print(f"per kind, through host 2: {got}", flush=True)
                    if got != want:
                        print(f"MISMATCH: expected {want}", flush=True)
                        return 1
                    victim = next(i for i in range(3) if cluster.daemon_id(i) in owners.values() and i != 2)
                    clients[0].op("flush")
                    cluster.daemons[victim].kill9()
                    print(f"killed host {victim} (-9); the job runs again through host 2", flush=True)
                    survivors = [i for i in range(3) if i != victim]
                    again = run_job(spark, urls[2], tokens[2], storage, 2,
                                    ([urls[i] for i in survivors], [tokens[i] for i in survivors]))
                    print(f"per kind after failover: {again}", flush=True)
                    if again != want:
                        print(f"MISMATCH after failover: expected {want}", flush=True)
                        return 1
                finally:
                    spark.stop()
            for client in clients:
                client.close()
        finally:
            cluster.stop_all()
    print("cluster pipeline OK", flush=True)
    return 0


if __name__ == "__main__":
    # stopped by a service manager or `kill`: unwind, so what it started is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("cluster-pipeline-data").resolve()))
