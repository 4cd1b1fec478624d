"""Real daemons with their metadata on a real PostgreSQL (``--metadata postgresql://``):
every operation, kill -9 and restart, another host taking over from PostgreSQL and
tier-2 alone, one database bound to one tier-2, and no password in any output."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tierfs.contracts.errors import SegmentNotFoundError
from tierfs.testing.harness import Daemon, start_daemon


def _config(path: Path, tier2: Path, metadata_url: str | None = None) -> Path:
    lines = [f'tier2_url = "{tier2}"', "flush_interval_s = 0.2", "owner_check_interval_s = 0.2"]
    if metadata_url is not None:
        lines.append(f'metadata_url = "{metadata_url}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def _segment_names(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return sorted(name for (name,) in conn.execute("SELECT name FROM segments"))


def test_every_operation_on_postgresql_and_every_acknowledged_byte_after_kill9(
    postgres_url: str, tmp_path: Path
) -> None:
    config = _config(tmp_path / "tierfs.toml", tmp_path / "tier2", postgres_url)
    data_dir = tmp_path / "host-a"
    daemon = start_daemon(data_dir, config_file=config)
    client = daemon.client()
    client.op("mkdir", path="logs")
    client.create("logs/pd")
    client.create("logs/vd", durability="vd")
    client.create("logs/a")
    client.create("logs/b")
    pd = b"".join(b"pd-%04d\n" % i for i in range(300))
    client.append("logs/pd", pd[:1200])
    client.op("flush")
    client.append("logs/pd", pd[1200:])  # acknowledged (PD): in the journal, maybe not flushed
    client.append("logs/vd", b"vd bytes\n")
    client.op("sync")
    client.append("logs/a", b"first part\n")
    client.append("logs/b", b"second part\n")
    client.op("seal", path="logs/b")
    client.op("concat", target="logs/a", sources=["logs/b"])
    client.op("mv", source="logs/a", target="logs/joined")
    client.create("logs/gone")
    client.delete("logs/gone")
    assert sorted(info.name for info in client.ls("logs")) == ["logs/joined", "logs/pd", "logs/vd"]
    assert client.stat("logs/pd").length == len(pd)
    client.close()
    assert not (data_dir / "metadata.sqlite").exists()  # the metadata is in PostgreSQL
    assert _segment_names(postgres_url) == ["logs/joined", "logs/pd", "logs/vd"]

    daemon.kill9()
    again = start_daemon(data_dir, config_file=config)
    try:
        client = again.client()
        assert client.read("logs/pd") == pd
        assert client.read("logs/vd") == b"vd bytes\n"
        assert client.read("logs/joined") == b"first part\nsecond part\n"
        with pytest.raises(SegmentNotFoundError):
            client.stat("logs/gone")
        client.append("logs/pd", b"after restart\n")
        client.op("flush")
        assert client.read("logs/pd") == pd + b"after restart\n"
        report = client.op("fsck")
        assert report["problems"] == [] and report["segments"] == 3, report
        client.close()
    finally:
        again.stop()


def test_another_host_takes_over_from_postgresql_and_tier2_alone(postgres_url: str, tmp_path: Path) -> None:
    """Host A dies with its disk; host B, with an empty data dir, takes over from the
    shared PostgreSQL and tier-2: every flushed byte reads back, appends go on, and A
    coming back is refused. What A acknowledged as PD but never flushed was on A's
    disk only (PD survives a process crash, not the loss of the host)."""
    config = _config(tmp_path / "tierfs.toml", tmp_path / "tier2", postgres_url)
    host_a = start_daemon(tmp_path / "host-a", config_file=config)
    client = host_a.client()
    client.create("events")
    flushed = b"".join(b"event-%04d\n" % i for i in range(500))
    client.append("events", flushed)
    client.op("flush")
    client.close()
    host_a.kill9()

    host_b = start_daemon(tmp_path / "host-b", "--takeover", config_file=config)
    try:
        client = host_b.client()
        assert client.read("events") == flushed
        client.append("events", b"on host b\n")
        client.op("flush")
        assert client.read("events") == flushed + b"on host b\n"
        client.close()
        refused = Daemon(tmp_path / "host-a", ["serve"], config_file=config)
        code, stderr = refused.wait()
        assert code == 5 and "owned by epoch" in stderr, stderr
    finally:
        host_b.stop()


def test_a_database_belongs_to_one_tier2(postgres_url: str, tmp_path: Path) -> None:
    first = start_daemon(tmp_path / "a", config_file=_config(tmp_path / "one.toml", tmp_path / "tier2-one"),
                         env={"TIERFS_METADATA": postgres_url})
    client = first.client()
    client.create("kept")
    client.close()
    first.stop()
    other = Daemon(tmp_path / "b", ["serve"], config_file=_config(tmp_path / "two.toml", tmp_path / "tier2-two"),
                   env={"TIERFS_METADATA": postgres_url})
    code, stderr = other.wait()
    assert code != 0
    assert f"belongs to tier-2 {tmp_path / 'tier2-one'}, not {tmp_path / 'tier2-two'}" in stderr, stderr
    assert _segment_names(postgres_url) == ["kept"]


def test_the_password_never_appears_and_an_unreachable_database_is_a_clear_error(
    postgres_url: str, tmp_path: Path
) -> None:
    secret = "s3cret-Pa55word"
    # trust authentication accepts any password: the URL carries one all the same
    with_password = postgres_url.replace("tierfs@", f"tierfs:{secret}@")
    config = _config(tmp_path / "tierfs.toml", tmp_path / "tier2")
    daemon = start_daemon(tmp_path / "a", "--metadata", with_password, config_file=config)
    client = daemon.client()
    client.create("x")
    health = client.op("fsck")
    metrics = daemon.metrics()
    client.close()
    _, stderr = daemon.stop()
    assert secret not in stderr and secret not in repr(health) and secret not in repr(metrics)

    nowhere = with_password.rsplit("@", 1)[0] + "@127.0.0.1:1/none"
    refused = Daemon(tmp_path / "b", ["serve", "--metadata", nowhere], config_file=config)
    code, stderr = refused.wait()
    assert code != 0
    assert "metadata database postgresql://tierfs:***@127.0.0.1:1/none is unavailable" in stderr, stderr
    assert secret not in stderr
