"""Many daemons, one namespace (cluster mode), on one machine as several hosts: three
real daemons with their own data dirs and ports on one real PostgreSQL and one tier-2.
Appends through every host to containers owned by others, failover after kill -9, a
zombie owner that wakes up after its lease was taken, rebalancing on join and leave."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierfs.cli.commands.cluster import status_text
from tierfs.cluster.container_map import container_of
from tierfs.cluster.status import ClusterStatus, ContainerStatus, DaemonStatus
from tierfs.contracts.cluster_errors import CrossContainerError
from tierfs.testing.cli_runner import run_tierfs
from tierfs.testing.cluster import Cluster

CONTAINERS = 6


def top_names(count: int = CONTAINERS) -> dict[int, str]:
    """One top-level name per container."""
    found: dict[int, str] = {}
    index = 0
    while len(found) < count:
        found.setdefault(container_of(f"t{index}", count), f"t{index}")
        index += 1
    return found


@pytest.fixture
def cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=2.0)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_every_host_serves_the_whole_namespace_and_forwards_writes(cluster: Cluster) -> None:
    for index in range(3):
        cluster.start(index)
    owners = cluster.wait_balanced([0, 1, 2])
    assert sorted(owners) == list(range(CONTAINERS))
    clients = [cluster.client(i) for i in range(3)]
    tops = top_names()
    expected: dict[str, bytes] = {}
    for container, top in tops.items():
        clients[container % 3].op("mkdir", path=top)
        name = f"{top}/log"
        clients[(container + 1) % 3].create(name)
        for host, client in enumerate(clients):  # every host appends, whoever owns it
            data = f"{name} from host {host}\n".encode()
            client.append(name, data)
            expected[name] = expected.get(name, b"") + data
    for client in clients:
        assert sorted(i.name for i in client.ls("")) == sorted(tops.values())
        for name, data in expected.items():
            assert client.read(name) == data
            assert client.stat(name).length == len(data)
    clients[0].op("flush")
    for client in clients:
        for name, data in expected.items():
            assert client.read(name) == data
    # /metrics: a sample per container held there (labelled), the unlabelled figure their sum
    for index, client in enumerate(clients):
        metrics = client.metrics()
        per_container = {name: value for name, value in metrics.items()
                         if name.startswith("tierfs_container_appends_total{")}
        assert sorted(per_container) == [f'tierfs_container_appends_total{{container="c{c:03d}"}}'
                                         for c in cluster.held_by(index)], metrics
        assert set(per_container.values()) == {3.0}  # one append from each host, landed on the owner
        assert sum(per_container.values()) == metrics["tierfs_appends_total"]
        assert all(f'tierfs_container_epoch{{container="c{c:03d}"}}' in metrics for c in cluster.held_by(index))
    # forwarded appends went to the owners' append listeners, which take only the token's
    _check_append_listeners(cluster, tops, expected)
    # a rename inside a top-level entry is metadata-only on its owner; across containers it
    # is refused before anything changes (EXDEV on the mount: mv copies)
    first, second = tops[0], tops[1]
    clients[2].op("mv", source=f"{first}/log", target=f"{first}/renamed")
    assert clients[1].read(f"{first}/renamed") == expected[f"{first}/log"]
    with pytest.raises(CrossContainerError):
        clients[0].op("mv", source=f"{first}/renamed", target=f"{second}/moved")
    assert clients[0].read(f"{first}/renamed") == expected[f"{first}/log"]
    report = clients[1].op("fsck")
    assert report["problems"] == [] and report["segments"] == CONTAINERS, report
    for client in clients:
        client.close()
    # fsspec users on two hosts (tierfs:// URLs with each daemon's URL and token)
    import fsspec

    from tierfs.contracts.datadir import load_or_create_token

    filesystems = [fsspec.filesystem("tierfs", url=f"http://127.0.0.1:{cluster.ports[i]}",
                                     token=load_or_create_token(cluster.data_dir(i)), skip_instance_cache=True)
                   for i in (0, 2)]
    with filesystems[0].open(f"tierfs://{second}/via-fsspec", "ab") as f:
        f.write(b"appended through fsspec on host 0\n")
    assert filesystems[1].cat(f"tierfs://{second}/via-fsspec") == b"appended through fsspec on host 0\n"
    assert sorted(p.rsplit("/", 1)[-1] for p in filesystems[1].ls(f"tierfs://{second}", detail=False)) == [
        "log", "via-fsspec"]


def _check_append_listeners(cluster: Cluster, tops: dict[int, str], expected: dict[str, bytes]) -> None:
    """Every daemon registered a TCP append listener; a request there without the
    daemon's token (or with another daemon's) is 401 and appends nothing; with it, and
    marked for the container, it lands; marked for a container the daemon does not hold,
    it is ``not_owner``."""
    import socket
    import urllib.parse

    import psycopg

    from tierfs.contracts.datadir import load_or_create_token

    with psycopg.connect(cluster.metadata_url) as conn:
        listeners = dict(conn.execute("SELECT daemon_id, append_url FROM cluster_daemons").fetchall())
    owners = cluster.owners()
    container, top = next(iter(tops.items()))
    owner = next(i for i in range(3) if cluster.daemon_id(i) == owners[container])
    other = (owner + 1) % 3
    parts = urllib.parse.urlsplit(listeners[cluster.daemon_id(owner)])
    assert parts.scheme == "tcp" and parts.port, listeners
    name = f"{top}/log"

    def post(token: str, marked: int) -> bytes:
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as conn:
            conn.sendall(f"POST /v1/segments/{name.replace('/', '%2F')} HTTP/1.1\r\nhost: t\r\n"
                         f"authorization: Bearer {token}\r\nx-tierfs-forwarded: {marked}\r\n"
                         f"content-length: 4\r\n\r\nraw\n".encode())
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                piece = conn.recv(65536)
                if not piece:
                    break
                answer += piece
        return answer

    assert post("", container).startswith(b"HTTP/1.1 401 ")
    assert post(load_or_create_token(cluster.data_dir(other)), container).startswith(b"HTTP/1.1 401 ")
    elsewhere = next(c for c, o in owners.items() if o != owners[container])
    assert b'"not_owner"' in post(load_or_create_token(cluster.data_dir(owner)), elsewhere)
    client = cluster.client(other)
    assert client.read(name) == expected[name]  # nothing of those landed
    landed = post(load_or_create_token(cluster.data_dir(owner)), container)
    assert landed.startswith(b"HTTP/1.1 200 ") and f'"offset":{len(expected[name])}'.encode() in landed
    expected[name] += b"raw\n"
    assert client.read(name) == expected[name]
    client.close()


@pytest.fixture
def slow_flush_cluster(postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster whose background flush waits a minute: what a test flushes explicitly is
    in tier-2, everything appended after it stays in the owner's tail."""
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=2.0,
                      flush_interval_s=60.0)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_flushed_bytes_are_read_from_tier2_on_the_host_that_reads(slow_flush_cluster: Cluster) -> None:
    """A non-owner reads a flushed segment's chunks itself (CRC-checked): the owner hands
    out the layout and serves only the unflushed tail, without a single tier-2 GET.
    (With the usual 0.2 s flush interval the tail could be flushed between the layout and
    the tail's read; the owner would then rightly read it from tier-2.)"""
    cluster = slow_flush_cluster
    for index in range(2):
        cluster.start(index)
    owners = cluster.wait_balanced([0, 1])
    owner_index = 0
    container = next(c for c, owner in owners.items() if owner == cluster.daemon_id(owner_index))
    name = f"{top_names()[container]}/big"
    reader = cluster.client(1)
    reader.create(name, parents=True)
    flushed = os.urandom(6 << 20)
    reader.append(name, flushed)
    reader.op("flush", path=name)
    tail = b"not yet in tier-2\n"
    reader.append(name, tail)
    gets_before = cluster.daemons[owner_index].metrics()["tierfs_tier2_gets_total"]
    assert reader.read(name) == flushed + tail
    assert reader.read(name, 1 << 20, (1 << 20) + (2 << 20)) == flushed[1 << 20: 3 << 20]
    assert cluster.daemons[owner_index].metrics()["tierfs_tier2_gets_total"] == gets_before
    reader.close()


def _wait_for(predicate, timeout_s: float = 30.0, what: str = "condition", progress=None):  # type: ignore[no-untyped-def]
    """Wait until ``predicate()`` is true; fail after ``timeout_s`` in which ``progress()``
    (if given) did not change: a loaded machine is slow, not stuck."""
    deadline = time.monotonic() + timeout_s
    last = progress() if progress else None
    while True:
        value = predicate()
        if value:
            return value
        if progress is not None and (now := progress()) != last:
            last, deadline = now, time.monotonic() + timeout_s
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s" + (" of no progress" if progress else ""))
        time.sleep(0.1)


def _files_containing(root: Path, data: bytes, under: str) -> list[Path]:
    """Files below ``root`` whose path has ``under`` and whose bytes hold ``data`` (a
    container's data dir may move to lost+found while this walks it: tried again)."""
    for _ in range(10):
        try:
            return [p for p in root.rglob("*") if p.is_file() and under in str(p) and data in p.read_bytes()]
        except FileNotFoundError:
            continue
    return []


def test_failover_after_kill9_keeps_every_flushed_byte_and_tails_continue(cluster: Cluster) -> None:
    """kill -9 of an owner: another daemon takes its containers once the lease expires;
    every byte flushed to tier-2 reads back, appends resume on the new owner, a tail on
    another host continues without a restart; what the dead owner acknowledged (PD) but
    never flushed was on its disk only and, when it comes back, is kept in its
    lost+found, never replayed over the new owner's data."""
    for index in range(3):
        cluster.start(index)
    owners = cluster.wait_balanced([0, 1, 2])
    victim_id = cluster.daemon_id(2)
    container = next(c for c, owner in owners.items() if owner == victim_id)
    top = top_names()[container]
    name, other = f"{top}/events", f"{top}/unflushed"
    host0, host1 = cluster.client(0), cluster.client(1)
    host0.create(name, parents=True)
    host0.create(other)
    flushed = b"".join(b"event-%04d\n" % i for i in range(200))
    host1.append(name, flushed)
    host0.op("flush")
    unflushed = b"acknowledged on the victim's disk only\n"

    followed: list[bytes] = []

    def follow() -> None:
        client = cluster.client(0)
        try:
            for piece in client.follow(name, len(flushed), poll_timeout_s=5.0):
                followed.append(piece)
                if b"".join(followed).endswith(b"after failover\n"):
                    return
        finally:
            client.close()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    host1.append(other, unflushed)
    cluster.daemons[2].kill9()
    killed_at = time.monotonic()
    offset = host0.append(name, b"after failover\n")  # waits for the new owner
    failover_s = time.monotonic() - killed_at
    assert offset == len(flushed)
    assert failover_s < 2.0 + 20.0, failover_s
    new_owner = cluster.owners()[container]
    assert new_owner in (cluster.daemon_id(0), cluster.daemon_id(1))
    for client in (host0, host1):
        assert client.read(name) == flushed + b"after failover\n"
        assert client.read(other) == b""  # PD survives a process crash on its own disk, not failover
    follower.join(timeout=30)
    assert b"".join(followed) == b"after failover\n"

    cluster.start(2)  # the old owner comes back: its journal is kept, not replayed
    kept = _wait_for(lambda: _files_containing(cluster.data_dir(2), unflushed, "lost+found"),
                     what="the victim's unflushed bytes in its lost+found")
    assert kept
    cluster.wait_balanced([0, 1, 2])
    host2 = cluster.client(2)
    assert host2.read(other) == b""
    assert host2.read(name) == flushed + b"after failover\n"
    report = host2.op("fsck")
    assert any("lost+found" in problem["segment"] for problem in report["problems"]), report
    for client in (host0, host1, host2):
        client.close()


def test_a_zombie_owner_that_wakes_up_after_losing_its_lease_commits_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS, lease_s=2.0,
                      flush_interval_s=30.0)
    try:
        for index in range(3):
            cluster.start(index)
        owners = cluster.wait_balanced([0, 1, 2])
        zombie_id = cluster.daemon_id(2)
        container = next(c for c, owner in owners.items() if owner == zombie_id)
        name = f"{top_names()[container]}/z"
        host0 = cluster.client(0)
        host0.create(name, parents=True)
        before = b"flushed before the pause\n"
        host0.append(name, before)
        host0.op("flush", path=name)
        in_zombie_only = b"acknowledged by the zombie, never committed\n"
        host0.append(name, in_zombie_only)
        os.kill(cluster.daemons[2].pid, signal.SIGSTOP)
        try:
            assert host0.append(name, b"on the new owner\n") == len(before)  # after the lease expired
            host0.op("flush", path=name)
        finally:
            os.kill(cluster.daemons[2].pid, signal.SIGCONT)
        # the zombie wakes, finds its lease taken, and is fenced: nothing of its reaches
        # the metadata; its acknowledged bytes go to its lost+found
        _wait_for(lambda: _files_containing(cluster.data_dir(2), in_zombie_only, "lost+found"),
                  what="the zombie's bytes in its lost+found")
        cluster.wait_balanced([0, 1, 2])
        host0.op("flush")
        for index in range(3):
            client = cluster.client(index)
            assert client.read(name) == before + b"on the new owner\n"
            client.close()
        host0.close()
    finally:
        cluster.stop_all()


def test_containers_rebalance_when_daemons_join_and_leave(cluster: Cluster) -> None:
    cluster.start(0)
    assert len(cluster.wait_balanced([0]).values()) == CONTAINERS
    alone = run_tierfs("--config", str(cluster.config), "cluster", "drain", cluster.daemon_id(0))
    assert alone.returncode == 1 and b"no other live daemon could take" in alone.stderr, alone.stderr
    host0 = cluster.client(0)
    written = {}
    for container, top in top_names().items():
        name = f"{top}/kept"
        host0.create(name, parents=True)
        written[name] = f"written while c{container} was on host 0\n".encode()
        host0.append(name, written[name])
    cluster.start(1)
    cluster.wait_balanced([0, 1])
    assert len(cluster.held_by(0)) == len(cluster.held_by(1)) == CONTAINERS // 2
    cluster.start(2)
    cluster.wait_balanced([0, 1, 2])
    assert sorted(len(cluster.held_by(i)) for i in range(3)) == [2, 2, 2]
    _assert_status_shows(cluster, [0, 1, 2])
    # drain host 2 (by its URL): it gives its containers back flushed, the others take them,
    # it takes none while drained, and it still serves the whole namespace through them
    held_by_2 = cluster.held_by(2)
    drained = run_tierfs("--config", str(cluster.config), "cluster", "drain", f"http://127.0.0.1:{cluster.ports[2]}",
                         "--json")
    assert drained.returncode == 0, drained.stderr
    report = json.loads(drained.stdout)
    assert report["daemon_id"] == cluster.daemon_id(2) and report["still_held"] == []
    assert sorted(report["moved"]) == [f"c{c:03d}" for c in held_by_2]
    assert set(report["moved"].values()) <= {cluster.daemon_id(0), cluster.daemon_id(1)}, report
    cluster.wait_balanced([0, 1])
    assert cluster.held_by(2) == []
    shown = json.loads(run_tierfs("--config", str(cluster.config), "cluster", "status", "--json").stdout)
    assert {d["daemon_id"]: d["draining"] for d in shown["daemons"]}[cluster.daemon_id(2)] is True
    host2 = cluster.client(2)
    for name, data in written.items():
        assert host2.read(name) == data
    undrained = run_tierfs("--config", str(cluster.config), "cluster", "undrain", cluster.daemon_id(2))
    assert undrained.returncode == 0, undrained.stderr
    cluster.wait_balanced([0, 1, 2])
    assert sorted(len(cluster.held_by(i)) for i in range(3)) == [2, 2, 2]
    left_at = time.monotonic()
    cluster.daemons[1].stop()  # a clean leave gives its containers back at once
    cluster.wait_balanced([0, 2], timeout_s=30)
    assert time.monotonic() - left_at < 30
    assert sorted(len(cluster.held_by(i)) for i in (0, 2)) == [3, 3]
    _assert_status_shows(cluster, [0, 2])
    for name, data in written.items():
        assert host0.read(name) == data and host2.read(name) == data
    host0.close()
    host2.close()


def _assert_status_shows(cluster: Cluster, indexes: list[int]) -> None:
    """``tierfs cluster status`` on a cluster host (the daemons' config file and that
    host's data dir, whose credentials read the others' metrics) agrees with the lease
    table, and names no token; from another machine (no data dir of its own) it shows
    the same, without the metrics, and says why."""
    home = cluster.root / "operator-home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home)}
    host = ("--data-dir", str(cluster.data_dir(indexes[0])))
    deadline = time.monotonic() + 30
    while True:  # a renewal late on a loaded machine shows a lease expired for a moment: ask again
        done = run_tierfs("--config", str(cluster.config), *host, "cluster", "status", "--json", env=env)
        assert done.returncode == 0, done.stderr
        status, owners = json.loads(done.stdout), cluster.owners()
        if not status["unserved"] and None not in owners.values() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ids = {cluster.daemon_id(i): i for i in indexes}
    assert status["unserved"] == []
    assert {c["container"]: c["owner"] for c in status["containers"]} == owners
    assert all(c["state"] == "held" and c["lease_left_s"] > 0 for c in status["containers"])
    daemons = {d["daemon_id"]: d for d in status["daemons"]}
    assert set(daemons) == set(ids)  # a daemon that left is unregistered
    for daemon_id, index in ids.items():
        shown = daemons[daemon_id]
        assert shown["live"] and shown["reachable"], shown
        assert shown["containers"] == cluster.held_by(index)
        assert shown["url"] == f"http://127.0.0.1:{cluster.ports[index]}"
        assert shown["lost_found_entries"] == 0 and shown["flush_backlog_bytes"] >= 0
    table = run_tierfs("--config", str(cluster.config), "cluster", "status", env=env)
    text = table.stdout.decode()
    assert table.returncode == 0 and f"{len(ids)} live daemons of {len(ids)} registered" in text, text
    assert all(daemon_id in text for daemon_id in ids) and "CONTAINER  OWNER" in text
    assert "metrics not read: no cluster daemon's data dir here" in text, text
    elsewhere = json.loads(run_tierfs("--config", str(cluster.config), "cluster", "status", "--json", env=env).stdout)
    assert all(d["reachable"] is None and "metrics not read" in d["error"] for d in elsewhere["daemons"]), elsewhere
    for index in indexes:
        token = (cluster.data_dir(index) / "token").read_text().strip()
        assert token not in text and token not in done.stdout.decode()
    assert not (home / ".local").exists()  # no data dir made for the operator


def test_the_status_table_names_unserved_containers_and_daemons_that_did_not_answer() -> None:
    daemons = (DaemonStatus("host-a", "http://10.0.0.1:7070", 0.3, True, (0,), True, "", 5 << 20, 1.5, 1, 2048,
                            draining=True),
               DaemonStatus("host-b", "http://10.0.0.2:7070", 0.2, True, (), False, "no tierfs daemon at ..."),
               DaemonStatus("host-c", "http://10.0.0.3:7070", 42.0, False, ()))
    containers = (ContainerStatus(0, "host-a", 3, 1.5), ContainerStatus(1, "host-c", 7, -30.25),
                  ContainerStatus(2, None, 0, -1e9))
    status = ClusterStatus("postgresql://tierfs@db/tierfs", 10.0, daemons, containers)
    assert status.unserved == [1, 2]
    lines = status_text(status).splitlines()
    assert lines[0] == ("cluster on postgresql://tierfs@db/tierfs: 2 live daemons of 3 registered, "
                        "3 containers, lease 10 s")
    assert lines[2].split() == ["host-a", "http://10.0.0.1:7070", "0.3", "s", "ago", "yes,", "draining", "1", "5.0M",
                                "1.5", "s", "1", "(2.0K)"]
    assert lines[3].split()[-4:] == ["0", "unreachable", "-", "-"]
    assert lines[4].split()[-5:] == ["no", "0", "-", "-", "-"] and "42.0 s ago" in lines[4]
    assert [line.split()[1:] for line in lines[7:10]] == [["host-a", "3", "1.5", "s", "left"],
                                                          ["host-c", "7", "expired", "30.2", "s", "ago"],
                                                          ["-", "0", "free"]]
    assert lines[-2].startswith("unserved: c001, c002 (appends to them wait")
    assert lines[-1] == "host-b did not answer: no tierfs daemon at ..."


def test_cluster_status_without_a_cluster_names_the_fix(postgres_url: str, tmp_path: Path) -> None:
    """Not a cluster's database (the default SQLite, a PostgreSQL no cluster daemon set up,
    a daemon's URL): one line, and nothing is created."""
    for args, needle in ((["--data-dir", str(tmp_path / "d")], "reads a cluster's PostgreSQL database"),
                         (["--metadata", postgres_url], "holds no cluster: no daemon with containers > 0"),
                         (["--url", "http://127.0.0.1:1"], "instead of --url")):
        done = run_tierfs(*args, "cluster", "status")
        assert done.returncode == 1 and done.stdout == b"", done
        assert needle in done.stderr.decode() and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "d").exists()


def test_a_cluster_database_is_never_opened_as_a_single_store(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start(0)
    cluster.wait_balanced([0])
    from tierfs.testing.harness import Daemon

    single = Daemon(tmp_path / "single", ["serve"], env={"TIERFS_METADATA": cluster.metadata_url,
                                                          "TIERFS_TIER2": str(tmp_path / "tier2")})
    code, stderr = single.wait()
    assert code != 0 and "is a cluster's database" in stderr, stderr
    import psycopg

    with psycopg.connect(cluster.metadata_url) as conn:  # nothing was created in the cluster's schema
        assert conn.execute("SELECT to_regclass('public.segments')").fetchone()[0] is None


class _Writer(threading.Thread):
    """Appends numbered records to one segment through one host until stopped; keeps
    when each acknowledgement came."""

    def __init__(self, cluster: Cluster, host: int, name: str) -> None:
        super().__init__(daemon=True)
        self.client = cluster.client(host)
        self.name = name
        self.acked: list[tuple[int, float]] = []  # (record number, monotonic time of the ack)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def record(self, number: int) -> bytes:
        return b"%s-%06d\n" % (self.name.encode(), number)

    def run(self) -> None:
        number = 0
        try:
            while not self.stopping.is_set():
                self.client.append(self.name, self.record(number))
                self.acked.append((number, time.monotonic()))
                number += 1
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.client.close()

    def numbers_in(self, data: bytes) -> list[int]:
        prefix = self.name.encode() + b"-"
        lines = data.split(b"\n")
        assert lines[-1] == b"", f"{self.name}: a torn record at the end"
        numbers = []
        for line in lines[:-1]:
            assert line.startswith(prefix) and len(line) == len(prefix) + 6, line
            numbers.append(int(line[len(prefix):]))
        return numbers


@pytest.fixture(params=["local tier-2", "S3 tier-2 (moto)"])
def tier2_cluster(request: pytest.FixtureRequest, postgres_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Three-daemon clusters on a local directory and on moto's S3 server."""
    if request.param == "local tier-2":
        cluster = Cluster(tmp_path, postgres_url, str(tmp_path / "tier2"), containers=CONTAINERS)
    else:
        url, options = request.getfixturevalue("s3_bucket")
        cluster = Cluster(tmp_path, postgres_url, str(url), containers=CONTAINERS,
                          extra=[f'tier2_endpoint_url = "{options["endpoint_url"]}"'])
    try:
        yield cluster
    finally:
        cluster.stop_all()


def test_kill9_of_an_owner_and_the_loss_of_its_disk_during_pd_vd_and_tier2_appends(tier2_cluster: Cluster) -> None:
    """Each acknowledged byte after failover, per the stated semantics: tier2 keeps every
    acknowledged record; PD and VD keep every record flushed before the failure and may
    lose only records acknowledged since; no level ever duplicates or reorders one."""
    cluster = tier2_cluster
    for index in range(3):
        cluster.start(index)
    owners = cluster.wait_balanced([0, 1, 2])
    container = next(c for c, owner in owners.items() if owner == cluster.daemon_id(2))
    top = top_names()[container]
    setup = cluster.client(0)
    writers = []
    for level in ("pd", "vd", "tier2"):
        name = f"{top}/{level}"
        setup.create(name, parents=True, durability=level)
        writers.append(_Writer(cluster, len(writers) % 2, name))  # through hosts 0 and 1
    for writer in writers:
        writer.start()
    acked = lambda: sum(len(w.acked) for w in writers)  # noqa: E731
    _wait_for(lambda: all(len(w.acked) >= 20 for w in writers), what="appends before the flush", progress=acked)
    marks = {w.name: len(w.acked) for w in writers}  # acknowledged before this flush: in tier-2 after it
    setup.op("flush")
    _wait_for(lambda: all(len(w.acked) >= marks[w.name] + 20 for w in writers), what="appends after the flush",
              progress=acked)
    cluster.daemons[2].kill9()
    killed_at = time.monotonic()
    shutil.rmtree(cluster.data_dir(2))  # the host is gone with its disk
    _wait_for(lambda: all(w.acked and w.acked[-1][1] > killed_at + 0.5 for w in writers), timeout_s=60,
              what="appends acknowledged by the new owner")
    for writer in writers:
        writer.stopping.set()
    for writer in writers:
        writer.join(timeout=60)
        assert writer.error is None, writer.error
    setup.op("flush")
    reader = cluster.client(1)
    for writer in writers:
        present = writer.numbers_in(reader.read(writer.name))
        assert present == sorted(set(present)), f"{writer.name}: duplicated or reordered records"
        acked = [number for number, _ in writer.acked]
        after_failover = [number for number, at in writer.acked if at > killed_at + 0.5]
        if writer.name.endswith("tier2"):
            assert set(acked) <= set(present), f"tier2 lost {sorted(set(acked) - set(present))[:5]}"
        else:
            assert set(acked[: marks[writer.name]]) <= set(present), f"{writer.name} lost flushed records"
        assert set(after_failover) <= set(present)
    reader.close()
    setup.close()
