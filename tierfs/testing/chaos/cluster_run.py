"""A chaos run on three hosts: three cluster daemons on one real PostgreSQL and one
tier-2, writers through every daemon (each append to a container another daemon may
own is forwarded), and the faults that only many hosts have:

- ``pause_owner`` (path 1 of the data-safety issue): SIGSTOP a daemon past its lease,
  another takes its containers, SIGCONT; it must acknowledge nothing it can lose;
- ``database_outage`` (path 2): PostgreSQL down for several leases, then back; no
  daemon died, so no acknowledged append may be lost: every owner keeps its containers;
- ``kill_owner``: kill -9 of a daemon, restarted later; what it acknowledged and had not
  flushed is in its lost+found (``MOVED``), ``tier2`` appends in their segments;
- ``drain_owner``: ``tierfs cluster drain`` of a daemon while the writers go on (through
  it too), then ``undrain``; nothing is forgiven: every acknowledged append must be in
  its segment.

The ledger and writers are the single host's (``ledger``, ``writers``); the check reads
every segment through one daemon and every daemon's lost+found.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tierfs.cluster.container_map import container_of
from tierfs.contracts.errors import TierFSError
from tierfs.contracts.writers import Writer
from tierfs.testing.chaos.ledger import MOVED, Ledger
from tierfs.testing.chaos.runner import DURABILITIES, RunResult, run_steps
from tierfs.testing.chaos.writers import IDLE_TIMEOUT_S, HttpWriter, WriterGroup
from tierfs.testing.cluster import Cluster
from tierfs.testing.postgres import PostgresServer

HOSTS = 3
CONTAINERS = 4
LEASE_S = 2.0
_PROBE_SEQ = itertools.count(1)  # one line per probe: probes to several segments run at once


@dataclasses.dataclass
class ClusterChaos:
    cluster: Cluster
    server: PostgresServer
    ledger: Ledger
    rng: random.Random
    log: Callable[[str], None]
    outage_s: float | None = None  # a database outage this long (default: a few leases)

    def write_for(self, low_s: float = 0.3, high_s: float = 1.0) -> None:
        time.sleep(self.rng.uniform(low_s, high_s))

    def everyone_serving(self) -> None:
        self.cluster.wait_balanced(list(range(HOSTS)), timeout_s=120)


def pause_owner(chaos: ClusterChaos) -> None:
    chaos.write_for()
    victim = chaos.rng.randrange(HOSTS)
    pid = chaos.cluster.daemons[victim].pid
    probes = _segments_owned_by(chaos, victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(LEASE_S * 2 + chaos.rng.uniform(0.5, 2.0))  # its containers move meanwhile
        # appends sent to the paused owner itself: the first thing it sees when it wakes
        senders = [threading.Thread(target=_probe, args=(chaos, victim, segment), daemon=True) for segment in probes]
        for sender in senders:
            sender.start()
        time.sleep(0.2)
    finally:
        os.kill(pid, signal.SIGCONT)
        resumed_at = time.monotonic()
    for sender in senders:
        sender.join(timeout=IDLE_TIMEOUT_S)
    # what it acknowledged before the pause and had not flushed stays on its disk: in its
    # lost+found once another daemon owned the container (PD survives a crash of its own
    # disk, not a failover). An append sent before it woke may have been acknowledged by
    # it before the pause, the answer arriving after; one sent after it woke, and the
    # probes sent to it while it slept (answered only once it woke), must be kept.
    chaos.ledger.forgive(MOVED, f"PD/VD sent before host {victim} woke, not flushed yet",
                         lambda r: r.durability != "tier2" and r.sent_s < resumed_at
                         and not r.writer.startswith("probe"))
    chaos.write_for()
    chaos.everyone_serving()


def _segments_owned_by(chaos: ClusterChaos, host: int) -> list[str]:
    owners = chaos.cluster.owners()
    me = chaos.cluster.daemon_id(host)
    return sorted(s for s in chaos.ledger.segments() if owners.get(container_of(s, CONTAINERS)) == me)


def _probe(chaos: ClusterChaos, host: int, segment: str) -> None:
    """One record sent to ``host`` (paused: it answers once it wakes) until it is
    acknowledged, by whichever owner, with one writer identity throughout."""
    from tierfs.remote.client import TierClient
    from tierfs.remote.exactly_once import BytesPayload, append_exactly_once

    durability = chaos.ledger.segments()[segment]
    record = chaos.ledger.sent(segment, f"probe{host}", next(_PROBE_SEQ), durability, "http", 10)
    identity = Writer().next()
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        client = TierClient(f"unix://{chaos.cluster.data_dir(host) / 'tierfs.sock'}")
        try:
            append_exactly_once(client, segment, BytesPayload(record.line), conditional=False, writer=identity,
                                maybe_landed=True, budget_s=1.0)
            chaos.ledger.acked(record)
            return
        except (TierFSError, OSError):
            time.sleep(0.1)
        finally:
            client.close()


def database_outage(chaos: ClusterChaos) -> None:
    chaos.write_for()
    chaos.server.kill()
    time.sleep(chaos.outage_s or LEASE_S * 3 + chaos.rng.uniform(0.0, 3.0))  # longer than a lease
    chaos.server.start()
    chaos.write_for(1.0, 2.0)
    chaos.everyone_serving()


def kill_owner(chaos: ClusterChaos) -> None:
    chaos.write_for()
    victim = chaos.rng.randrange(HOSTS)
    chaos.cluster.daemons[victim].kill9()
    killed_at = time.monotonic()
    chaos.ledger.forgive(MOVED, f"PD/VD acknowledged by killed host {victim}, not flushed yet",
                         lambda r: r.durability != "tier2" and r.acked_s is not None and r.acked_s < killed_at)
    chaos.write_for(LEASE_S, LEASE_S * 2)
    chaos.cluster.start(victim)
    chaos.everyone_serving()


def drain_owner(chaos: ClusterChaos) -> None:
    from tierfs.cluster.drain import drain, undrain

    chaos.write_for()
    victim = chaos.cluster.daemon_id(chaos.rng.randrange(HOSTS))
    result = drain(chaos.cluster.metadata_url, LEASE_S, victim, wait_s=120)
    if result.still_held:
        raise RuntimeError(f"the drain of {victim} left {result.still_held} unmoved after 120 s")
    chaos.log(f"  drained {victim} in {result.seconds:.1f} s: {len(result.moved)} containers moved")
    chaos.write_for()
    undrain(chaos.cluster.metadata_url, victim)
    chaos.everyone_serving()


CLUSTER_NEMESES: dict[str, Callable[[ClusterChaos], None]] = {
    "pause_owner": pause_owner, "database_outage": database_outage, "kill_owner": kill_owner,
    "drain_owner": drain_owner,
}


def run_cluster(seed: int, steps: int, root: Path, *, nemeses: Sequence[str] = tuple(CLUSTER_NEMESES),
                writers: int = 4, log: Callable[[str], None] = print, in_turn: bool = False,
                outage_s: float | None = None) -> RunResult:
    from tierfs.testing.chaos.runner import replay_command

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(f"cluster{seed}")
    group = WriterGroup()
    problems: list[str] = []
    drawn: list[str] = []
    with PostgresServer() as server:  # in a directory of its own its unprivileged user can reach
        cluster = Cluster(root / "hosts", server.create_database(), str(root / "tier2"), containers=CONTAINERS,
                          lease_s=LEASE_S, flush_interval_s=0.3)
        chaos = ClusterChaos(cluster, server, ledger, rng, log, outage_s)
        try:
            for index in range(HOSTS):
                cluster.start(index)
            chaos.everyone_serving()
            setup = cluster.client(0)
            for index in range(writers):
                durability = DURABILITIES[index % len(DURABILITIES)]
                segment = f"t{index}/w{index}-{durability}"  # top-level names spread over containers
                setup.create(segment, parents=True, durability=durability)
                via = index % HOSTS  # through this daemon, whoever owns the container
                group.add(HttpWriter(ledger, segment, durability, f"w{index}", rng,
                                     cluster.data_dir(via) / "tierfs.sock", cluster.config))
            setup.close()
            drawn = run_steps(steps, nemeses, rng, in_turn, log, group, lambda name: CLUSTER_NEMESES[name](chaos),
                              lambda step, name: _check(chaos, step, name), problems)
        finally:
            group.stop()
            cluster.stop_all()
    return RunResult(seed, steps, drawn, problems, ledger.summary(),
                     replay_command(seed, steps, nemeses, False) + " --cluster")


def _check(chaos: ClusterChaos, step: int, nemesis: str) -> list[str]:
    client = chaos.cluster.client(0)
    try:
        client.op("sync")
        segments = {name: client.read(name) for name in sorted(chaos.ledger.segments())}
    finally:
        client.close()
    lost_found = bytearray()
    for index in range(HOSTS):
        root = chaos.cluster.data_dir(index) / "lost+found"
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if path.is_file():
                lost_found += path.read_bytes()
    return [f"after step {step} ({nemesis}): {p}" for p in chaos.ledger.check(segments, bytes(lost_found))]
