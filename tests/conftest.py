"""Shared fixtures: small-threshold store configs, an open store, an S3 server, one
SparkSession.

The S3-protocol server is moto in server mode, started once per session on
127.0.0.1 with a free port; buckets are created with boto3 (s3fs's mkdir sends a
location constraint moto rejects for us-east-1).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import fsspec
import jvm_class_archive
import pytest
from tierfs.fsspec_impl import TierFileSystem

from tierfs import StoreConfig, open_store
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import Daemon, Mount, free_port, small_config, start_daemon
from tierfs.testing.postgres import PostgresServer

# The files whose tests use the session's SparkSession (``spark`` below), longest first:
# one scope for xdist, so one worker runs them all and the run starts one Spark JVM
# (with its Python workers), not one per worker (each costs ~10 CPU-s on two cores).
SPARK_SESSION_FILES = (
    "test_cli_errors.py", "test_spark_arrow.py", "test_fuse_tools.py", "test_spark_write.py",
    "test_spark_stream.py", "test_spark.py", "test_spark_write_encoding.py",
)
# The files that take longest in a whole run (its ``--durations``, summed per file),
# longest first, the Spark session's as one (~260 s of ~1,800). ``./dev.sh test`` runs
# ``-n 3 --dist loadfile``: xdist hands whole files to the workers in collection order,
# after sorting them by their number of tests, which put these (a few long tests each)
# last, one worker running them while the others idled. Collected first, they run side
# by side, and the many short files fill in at the end.
LONGEST_FILES = (
    *SPARK_SESSION_FILES, "test_chaos.py", "test_examples.py", "test_fsspec.py", "test_cluster.py",
    "test_readme.py", "test_spark_events_benchmark.py", "test_model.py", "test_install_resolves.py",
    "test_cli.py", "test_s3_faults.py", "test_fencing.py", "test_spark_registration.py",
    "test_peer_benchmark.py", "test_fuse.py", "test_cli_tail.py", "test_cluster_benchmark.py",
    "test_fuse_identity.py", "test_packing.py", "test_followers.py", "test_spark_loopback.py",
    "test_recovery.py", "test_metadata_postgres_daemon.py",
)


# The suite's JVMs (Spark sessions, spark-submit, a standalone master and workers) live
# seconds, not hours: the C2 compiler and the parallel collector's threads cost them more
# CPU than they save (a quarter of a Spark test's CPU on two cores), and the archive of
# Spark's classes that ./dev.sh makes saves a third of their start-up
# (``jvm_class_archive``). Every java the suite starts reads this; a value set by the
# caller wins.
if "JDK_JAVA_OPTIONS" not in os.environ:
    os.environ["JDK_JAVA_OPTIONS"] = jvm_class_archive.java_options()
# The harness's daemons and mounts fork from an interpreter that imported tierfs once
# (``tierfs.testing.warm_start``), not a new one importing it again: ~0.35 CPU-s each,
# some 200 times a run. ``TIERFS_WARM_START=0`` runs every one as a new interpreter.
os.environ.setdefault("TIERFS_WARM_START", "1")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the ``SPARK_SESSION_FILES`` as one file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneSparkSession(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope = str(super()._split_scope(nodeid))
            return "spark-session" if Path(scope).name in SPARK_SESSION_FILES else scope

    return OneSparkSession(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand out files in collection order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``LONGEST_FILES`` first; every other file after them, in the order collected."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return small_config(tmp_path / "data")


@pytest.fixture
async def store(config: StoreConfig) -> AsyncIterator[SegmentStore]:
    async with open_store(config) as opened:
        yield opened


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, object]]:
    """A fresh bucket: returns (tier-2 URL, storage options)."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"tierfs-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return f"s3://{bucket}/chunks", {"endpoint_url": s3_endpoint}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A real daemon shared by the tests of one module."""
    running = start_daemon(tmp_path_factory.mktemp("daemon") / "data")
    yield running
    running.stop()


@pytest.fixture
def served_data_dir(daemon: Daemon) -> Path:
    """The data dir whose daemon ``tfs`` talks to (a module may override this fixture)."""
    return daemon.data_dir


@pytest.fixture
def tfs(served_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TierFileSystem]:
    """``fsspec.filesystem("tierfs")`` finding the module's daemon through TIERFS_DATA_DIR."""
    monkeypatch.setenv("TIERFS_DATA_DIR", str(served_data_dir))
    monkeypatch.delenv("TIERFS_URL", raising=False)
    # fsspec caches instances by constructor arguments; the daemon changes per module
    TierFileSystem.clear_instance_cache()
    fs = fsspec.filesystem("tierfs")
    assert isinstance(fs, TierFileSystem)
    yield fs
    # closed, and out of the cache: an open connection holds the daemon's stop up (its
    # HTTP server's 3 s grace) when the module's daemon stops right after this test
    TierFileSystem.clear_instance_cache()
    fs.client.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL for the whole run, started when a test first asks for it."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database of its own for each test, dropped after it."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession for the whole run: local[2] with up to 4 attempts per task (the
    ``,4``), so a test can fail a task once and watch Spark retry it. It never calls
    ``register(spark)``: every Spark test also shows that ``format("tierfs")`` is found by
    itself in ./dev.sh's venv (dev.sh makes ``pyspark_tierfs`` listable for PySpark)."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (./dev.sh test installs one)")
    from pyspark.sql import SparkSession

    from tierfs.spark.loopback import bind_to_loopback_unless_configured

    bind_to_loopback_unless_configured()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,4]").appName("tierfs-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    """One real mount per test module (modules with their own options define their own;
    each module using it skips itself where /dev/fuse or fusermount3 is missing);
    unmounted cleanly at the module's end."""
    base = tmp_path_factory.mktemp("mount")
    mounted = Mount(base / "data", base / "mnt")
    yield mounted
    code, stderr = mounted.unmount()
    assert code == 0, stderr
