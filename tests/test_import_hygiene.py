"""Import hygiene: client code never loads the engine or the server, and the CLI loads
only what its command needs. Each check runs a fresh interpreter, so nothing this
test process imported can hide a module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tierfs.testing.harness import start_daemon

# What only a process that owns a data dir (or serves it) needs.
ENGINE_AND_SERVER = ("sqlite3", "tierfs.engine", "tierfs.offload", "tierfs.store", "tierfs.server",
                     "hypercorn", "starlette")
# ... and what a command that talks to no store needs neither.
EVENT_LOOP_AND_HTTP = ("trio", "httpx")


def _forbidden(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def _modules_after(statement: str) -> set[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _cli_modules(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -m tierfs.cli ARGS`` with ``-X importtime``: every module it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tierfs.cli", *args],
                          capture_output=True, text=True, timeout=120)
    modules = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:")}
    return done, modules


def test_the_probe_sees_the_engine_when_it_is_imported() -> None:
    assert _forbidden(_modules_after("import tierfs.store.facade"), ENGINE_AND_SERVER)


@pytest.mark.parametrize("statement", [
    "import tierfs",
    "import tierfs.fsspec_impl",
    "import fsspec; fsspec.filesystem('tierfs', url='unix:///nonexistent/tierfs.sock')",
    "import tierfs.spark.read",
    "import tierfs.spark",
    "import tierfs.remote.client",
    "import tierfs.remote.remote_store",
    "import tierfs.cli",
])
def test_client_side_imports_stay_off_the_engine_and_server(statement: str) -> None:
    assert _forbidden(_modules_after(statement), ENGINE_AND_SERVER) == []


def test_the_served_store_protocol_loads_no_engine() -> None:
    """What the server and the mount are written against (``store/served.py``, with the
    statistics and infos it returns) comes without the engine, SQLite or trio."""
    modules = _modules_after("import tierfs.store.served")
    assert _forbidden(modules, ("tierfs.engine", "tierfs.offload", "sqlite3", "trio")) == []
    assert "tierfs.contracts.reports.statistics" in modules  # the probe sees what it imports


def test_a_one_host_daemon_loads_no_cluster_part_or_http_client() -> None:
    """Every daemon start imports the server; only a cluster daemon needs the cluster's
    router, its HTTP client and PostgreSQL's driver."""
    modules = _modules_after("import tierfs.cli.commands.daemon, tierfs.server.daemon")
    assert _forbidden(modules, ("httpx", "psycopg", "tierfs.remote", "tierfs.cluster.router",
                                "tierfs.cluster.opening")) == []
    assert "hypercorn" in modules  # the probe sees what it imports


def test_spark_lists_and_creates_the_source_without_arrow_or_http() -> None:
    """Spark starts a Python process for each planning step; the steps that only list
    the sources or ask one's schema import ``pyspark_tierfs`` and call ``name`` and
    ``schema``: no pyarrow, numpy, pandas or HTTP client for them."""
    statement = ("import pyspark_tierfs; source = pyspark_tierfs.DefaultSource({'format': 'raw'}); "
                 "assert source.name() == 'tierfs' and 'binary' in source.schema()")
    modules = _modules_after(statement)
    assert _forbidden(modules, ("pyarrow", "numpy", "pandas", "httpx", "fsspec", "tierfs.remote")) == []
    assert "tierfs.spark.source" in modules  # the probe sees what it imports


def test_contracts_import_nothing_else_of_tierfs() -> None:
    modules = _modules_after("import tierfs.contracts.api, tierfs.contracts.operations")
    assert sorted(m for m in modules if m.startswith("tierfs.") and not m.startswith("tierfs.contracts")) == []


@pytest.mark.parametrize("args", [["--help"], ["policy", "set", "--help"], ["frobnicate"]])
def test_help_and_usage_errors_load_no_event_loop_http_or_engine(args: list[str]) -> None:
    done, modules = _cli_modules(*args)
    assert done.returncode == (0 if "--help" in args else 2), done.stderr[-2000:]
    assert "usage: tierfs" in done.stdout + done.stderr
    assert "tierfs.contracts.policy" in modules  # the probe sees what the parser imports
    assert _forbidden(modules, ENGINE_AND_SERVER + EVENT_LOOP_AND_HTTP) == []


def test_an_in_process_command_loads_no_server_or_http_client(tmp_path: Path) -> None:
    done, modules = _cli_modules("--data-dir", str(tmp_path / "d"), "mkdir", "x")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tierfs.store.facade" in modules
    assert _forbidden(modules, ("tierfs.server", "hypercorn", "starlette", "httpx")) == []


def test_a_command_against_the_daemon_loads_no_engine(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "d")
    try:
        done, modules = _cli_modules("--data-dir", str(daemon.data_dir), "mkdir", "x")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "tierfs.remote.remote_store" in modules
        assert _forbidden(modules, ENGINE_AND_SERVER) == []
        client = daemon.client()
        assert [e.name for e in client.ls()] == ["x"]
        client.close()
    finally:
        daemon.stop()


COUNT_COLLECTIONS = """
import gc, sys
collections = []
gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
sys.argv = ["tierfs", *sys.argv[1:]]
try:
    from tierfs.cli.parser import main
    main()
finally:
    print("collections:", len(collections), file=sys.stderr)
"""


def test_a_command_starts_without_a_collection_per_module(tmp_path: Path) -> None:
    """A command imports a few hundred modules; at the collector's default thresholds
    this one ran 93 collections (a daemon's start-up ~120, a tenth of its CPU). The
    ones left come before ``main`` runs: importing the parser."""
    done = subprocess.run([sys.executable, "-c", COUNT_COLLECTIONS, "--data-dir", str(tmp_path / "d"), "mkdir", "x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    collections = int(done.stderr.rsplit("collections:", 1)[1])
    assert collections <= 30, done.stderr[-2000:]
