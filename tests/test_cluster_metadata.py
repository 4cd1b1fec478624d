"""``tierfs metadata export|import`` on PostgreSQL (issue 36 item 8): a cluster's
metadata, every container in one consistent stream, exported while its daemons serve and
imported into a new database, where a new cluster on the same tier-2 serves every byte
and goes on writing; a single store on PostgreSQL the same way."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tierfs.testing.cluster import Cluster
from tierfs.testing.harness import small_config
from tierfs.testing.postgres import PostgresServer

pytestmark = pytest.mark.usefixtures("postgres_server")  # skipped where PostgreSQL is not installed


def _tierfs(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tierfs.cli", *args], input=stdin, capture_output=True,
                          timeout=300)


def _config(path: Path, metadata_url: str, tier2: Path, containers: int) -> Path:
    path.write_text(f'metadata_url = "{metadata_url}"\ntier2_url = "{tier2}"\ncontainers = {containers}\n')
    return path


def test_a_clusters_metadata_moves_to_a_new_database_and_a_new_cluster_serves_it(
        tmp_path: Path, postgres_server: PostgresServer) -> None:
    tier2 = tmp_path / "tier2"
    old_url, new_url = postgres_server.create_database(), postgres_server.create_database()
    old = Cluster(tmp_path / "old", old_url, str(tier2), containers=4)
    export = tmp_path / "cluster.metadata"
    try:
        old.start_together([0, 1])
        old.wait_balanced([0, 1])
        expected = old.write_in_every_container([0, 1])
        client = old.client(0)
        client.op("flush")
        client.close()
        exported = _tierfs("--config", str(old.config), "metadata", "export", str(export))  # while they serve
        assert exported.returncode == 0, exported.stderr
    finally:
        old.stop_all()
    header = export.read_bytes().split(b"\n", 1)[0]
    assert b'"format": "tierfs-cluster-metadata"' in header and b'"containers": 4' in header

    new_config = _config(tmp_path / "new.toml", new_url, tier2, 4)
    truncated = export.read_bytes().rsplit(b"\n", 3)[0] + b"\n"
    refused = _tierfs("--config", str(new_config), "metadata", "import", "-", stdin=truncated)
    assert refused.returncode != 0 and b"truncated" in refused.stderr, refused.stderr
    with psycopg.connect(new_url) as conn:
        assert conn.execute("SELECT count(*) FROM c000.segments").fetchone() == (0,)  # nothing loaded
    wrong_count = _tierfs("--config", str(_config(tmp_path / "six.toml", new_url, tier2, 6)), "metadata", "import",
                          str(export))
    assert wrong_count.returncode != 0 and b"import with containers = 4" in wrong_count.stderr, wrong_count.stderr
    imported = _tierfs("--config", str(new_config), "metadata", "import", str(export))
    assert imported.returncode == 0, imported.stderr
    again = _tierfs("--config", str(new_config), "metadata", "import", str(export))
    assert again.returncode != 0 and b"import only into an empty store" in again.stderr, again.stderr

    new = Cluster(tmp_path / "new", new_url, str(tier2), containers=4)
    try:
        new.start_together([0, 1])
        new.wait_balanced([0, 1])
        busy = _tierfs("--config", str(new.config), "metadata", "import", str(export))
        assert busy.returncode != 0 and b"stop them before an import" in busy.stderr, busy.stderr
        client = new.client(1)
        try:
            assert {name: client.read(name) for name in expected} == expected
            for name in expected:  # the new owners write on, above every epoch the old ones used
                client.append(name, b"after the move\n")
            client.op("flush")
            assert all(client.read(name) == data + b"after the move\n" for name, data in expected.items())
            report = client.op("fsck")
            assert report["problems"] == [], report
        finally:
            client.close()
    finally:
        new.stop_all()


async def test_a_single_store_on_postgresql_exports_and_imports(tmp_path: Path, postgres_server: PostgresServer) -> None:
    import io

    from tierfs import open_store
    from tierfs.store.datadir.metadata_files import export_store_metadata, import_store_metadata

    tier2 = tmp_path / "tier2"
    source = small_config(tmp_path / "a", tier2_url=str(tier2), metadata_url=postgres_server.create_database())
    async with open_store(source) as store:
        await store.create("logs/app", make_parents=True)
        await store.append("logs/app", b"on postgresql\n")
        await store.flush()
    stream = io.BytesIO()
    rows = export_store_metadata(source, stream)
    assert rows >= 3

    target = small_config(tmp_path / "b", tier2_url=str(tier2), metadata_url=postgres_server.create_database())
    assert import_store_metadata(target, io.BytesIO(stream.getvalue())) == rows
    # the tier-2 was claimed by the first data dir: the new one takes it over, as on SQLite
    async with open_store(dataclasses.replace(target, takeover=True)) as store:
        assert await store.read("logs/app") == b"on postgresql\n"
        await store.append("logs/app", b"and on\n")
        await store.flush()
        assert await store.read("logs/app") == b"on postgresql\nand on\n"


def test_an_unreachable_database_is_named_not_waited_on(tmp_path: Path) -> None:
    """An export or import against a database that does not answer ends with its URL
    (the password redacted) and why, not a hang or a traceback."""
    from tierfs.testing.harness import free_port

    url = f"postgresql://tierfs:secret@127.0.0.1:{free_port()}/nothing"
    for args in (["metadata", "export", "-"], ["metadata", "import", "-"]):
        done = _tierfs("--data-dir", str(tmp_path / "d"), "--metadata", url, *args, stdin=b"")
        err = done.stderr.decode()
        assert done.returncode != 0 and "127.0.0.1" in err and "secret" not in err, err
        assert "Traceback" not in err, err
