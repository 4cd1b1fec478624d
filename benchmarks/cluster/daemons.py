"""Cluster benchmark, daemons part: real cluster daemons on one PostgreSQL and one local
tier-2, on this machine.

- Append throughput with 1, 2 and 3 daemons: 1 KiB PD appends for ``--seconds`` by
  ``--writers`` client processes per daemon, each to a segment of a container that
  daemon owns, over its Unix socket. The ceiling, same clients, same run: one single-host
  daemon. Every daemon and client shares this machine's cores, so the sum cannot grow
  with daemons here; on separate hosts each brings its own disk and cores.
- Failover (``--failovers`` runs): a client on the survivor appends to a segment of the
  other daemon, which is killed (-9); the time until the survivor's next append is
  accepted by the new owner. Bound: the lease expires ``lease_s`` after the last renewal
  (every tick: ``lease_s / 3``, at most 1 s), the taker looks every tick, then opens the
  container: ``lease_s - tick`` to ``lease_s + tick`` plus the opening.
- Tail latency across hosts: lines appended every 10 ms through the owner, followed at
  once on the owner (the ceiling) and on another daemon (which forwards the poll).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.harness.figures import percentile
from tierfs.cluster.container_map import container_of
from tierfs.testing.cluster import Cluster
from tierfs.testing.harness import start_daemon
from tierfs.testing.postgres import PostgresServer

CONTAINERS = 6
RECORD_BYTES = 1024

_WRITER = """
import sys, time
from tierfs.remote.client import TierClient
client = TierClient(sys.argv[1])
name, seconds = sys.argv[2], float(sys.argv[3])
record = b"x" * {record} + b"\\n"
client.append(name, record)  # connected and warm before the clock starts
print("ready", flush=True)
sys.stdin.readline()
count, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    client.append(name, record)
    count += 1
print(count, flush=True)
""".replace("{record}", str(RECORD_BYTES - 1))


def _top_for(container: int) -> str:
    index = 0
    while container_of(f"b{index}", CONTAINERS) != container:
        index += 1
    return f"b{index}"


def _run_writers(targets: list[tuple[str, str]], seconds: float) -> float:
    """Appends per second summed over one writer process per (socket URL, name)."""
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, name, str(seconds)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for url, name in targets]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    counts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        counts.append(int(out.strip()))
    return sum(counts) / seconds


def append_throughput(directory: Path, server: PostgresServer, writers: int, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    single = start_daemon(directory / "s", config_file=_single_config(directory))
    try:
        client = single.client()
        for w in range(writers):
            client.create(f"w{w}")
        client.close()
        figures["single host"] = _run_writers([(single.url, f"w{w}") for w in range(writers)], seconds)
    finally:
        single.stop()
    for daemons in (1, 2, 3):
        url = server.create_database()
        cluster = Cluster(directory / f"c{daemons}", url, str(directory / f"t{daemons}"),
                          containers=CONTAINERS, lease_s=10.0, flush_interval_s=1.0)
        try:
            for index in range(daemons):
                cluster.start(index)
            owners = cluster.wait_balanced(list(range(daemons)))
            targets = []
            for index in range(daemons):
                mine = [c for c, owner in owners.items() if owner == cluster.daemon_id(index)]
                client = cluster.client(index)
                for w in range(writers):
                    name = f"{_top_for(mine[w % len(mine)])}/w{index}-{w}"
                    client.create(name, parents=True)
                    targets.append((cluster.daemons[index].url, name))
                client.close()
            figures[f"{daemons} daemon{'s' if daemons > 1 else ''}"] = _run_writers(targets, seconds)
        finally:
            cluster.stop_all()
            server.drop_database(url.rsplit("/", 1)[1])
    return figures


def _single_config(directory: Path) -> Path:
    path = directory / "single.toml"
    path.write_text('flush_interval_s = 1.0\n')
    return path


def failover_times(directory: Path, server: PostgresServer, runs: int, lease_s: float) -> list[float]:
    url = server.create_database()
    cluster = Cluster(directory / "f", url, str(directory / "tf"), containers=CONTAINERS,
                      lease_s=lease_s)
    times: list[float] = []
    try:
        cluster.start(0)
        for run in range(runs):
            victim = run + 1  # a fresh data dir each time: a new host joins, then dies
            cluster.start(victim)
            owners = cluster.wait_balanced([0, victim], timeout_s=lease_s * 6 + 60)
            container = next(c for c, owner in owners.items() if owner == cluster.daemon_id(victim))
            name = f"{_top_for(container)}/failover-{run}"
            survivor = cluster.client(0)
            survivor.create(name, parents=True)
            survivor.append(name, b"before\n")
            cluster.daemons[victim].kill9()
            killed_at = time.monotonic()
            survivor.append(name, b"after\n")  # waits for the new owner
            times.append(time.monotonic() - killed_at)
            survivor.close()
    finally:
        cluster.stop_all()
        server.drop_database(url.rsplit("/", 1)[1])
    return times


def tail_latencies(directory: Path, server: PostgresServer, lines: int) -> dict[str, list[float]]:
    """Seconds from each append (through the owner) to its arrival at a follower on the
    owner itself (the ceiling) and at one on another daemon, side by side."""
    url = server.create_database()
    cluster = Cluster(directory / "tl", url, str(directory / "tt"), containers=CONTAINERS, lease_s=10.0)
    try:
        cluster.start(0)
        cluster.start(1)
        owners = cluster.wait_balanced([0, 1])
        container = next(c for c, owner in owners.items() if owner == cluster.daemon_id(0))
        name = f"{_top_for(container)}/tail"
        writer = cluster.client(0)
        writer.create(name, parents=True)
        arrivals: dict[str, list[float]] = {"on the owner": [], "on another daemon": []}

        def follow(label: str, host: int) -> None:
            client = cluster.client(host)
            seen, buffer = 0, b""
            try:
                for piece in client.follow(name, 0, poll_timeout_s=5.0):
                    now = time.monotonic()
                    buffer += piece
                    *complete, buffer = buffer.split(b"\n")
                    for line in complete:
                        arrivals[label].append(now - float(line))
                    seen += len(complete)
                    if seen >= lines:
                        return
            finally:
                client.close()

        followers = [threading.Thread(target=follow, args=(label, host), daemon=True)
                     for label, host in (("on the owner", 0), ("on another daemon", 1))]
        for thread in followers:
            thread.start()
        time.sleep(0.5)  # both are waiting
        for _ in range(lines):
            writer.append(name, b"%.6f\n" % time.monotonic())
            time.sleep(0.01)
        for thread in followers:
            thread.join(timeout=60)
        writer.close()
        return arrivals
    finally:
        cluster.stop_all()
        server.drop_database(url.rsplit("/", 1)[1])


def report(throughput: dict[str, float], failovers: list[float], lease_s: float, writers: int,
           seconds: float, tails: dict[str, list[float]]) -> list[str]:
    lines = [f"1 KiB PD appends, {writers} writer processes per daemon, {seconds:g} s (appends/s)"]
    ceiling = throughput["single host"]
    for label, rate in throughput.items():
        lines.append(f"  {label:12} {rate:10,.0f}   {rate / ceiling:5.2f}x the single-host daemon")
    ordered = sorted(failovers)
    lines.append(f"failover (kill -9 -> first append accepted by the new owner), {len(ordered)} runs, "
                 f"lease {lease_s:g} s: p50 {percentile(ordered, 0.5):.2f} s, p99 {percentile(ordered, 0.99):.2f} s, "
                 f"max {ordered[-1]:.2f} s")
    tick = min(lease_s / 3, 1.0)
    lines.append(f"  bound: lease expiry and its discovery {lease_s - tick:.2f}..{lease_s + tick:.2f} s after the kill, "
                 "plus opening the container")
    owner = sorted(tails["on the owner"])
    other = sorted(tails["on another daemon"])
    lines.append(f"tail -f latency, append through the owner -> line at a follower, {len(other)} lines (ms): "
                 f"on another daemon p50 {percentile(other, 0.5) * 1e3:.1f} p99 {percentile(other, 0.99) * 1e3:.1f}, "
                 f"on the owner (ceiling) p50 {percentile(owner, 0.5) * 1e3:.1f} p99 {percentile(owner, 0.99) * 1e3:.1f}")
    return lines
