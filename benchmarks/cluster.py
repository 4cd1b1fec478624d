"""Cluster benchmark: what a metadata operation costs on PostgreSQL next to SQLite, what
namespace operations cost as the store grows, and real cluster daemons on one PostgreSQL
and one local tier-2 on this machine.

1. Metadata latency (``--rounds``, 300): a ``MetadataStore`` on SQLite (WAL,
   synchronous=FULL) and one on a durable PostgreSQL on 127.0.0.1, interleaved, the order
   alternating: ``create_segment``, ``find_segment`` (a stat that misses the daemon's
   memory), ``commit_flush`` (record + chunk); the bounds: ``SELECT 1`` and the smallest
   durable commit (a one-row upsert).
2. Namespace scaling (the probes of ``benchmarks scale``): ``--small`` and ``--large``
   segments (``--large-dir`` in one directory): open time and RSS, ``stat`` of 2,000
   names, ``ls`` of a 10-entry directory and of the big one, ratios large/small.
3. Append throughput with 1, 2 and 3 daemons: 1 KiB PD appends for ``--seconds`` by
   ``--writers`` client processes per daemon, each to a segment that daemon owns. The
   ceiling, same clients, same run: one single-host daemon (all share two cores here).
4. Failover (``--failovers`` runs, at ``--lease``, by default tierfs's own): a client on
   the survivor appends to a segment of the other daemon, which is killed (-9); the time
   until the survivor's next append is accepted by the new owner. Bound: the lease
   expires ``lease_s`` after the last renewal (every tick: ``lease_s / 3``, at most 1 s),
   the taker looks every look (a tick, at most 0.25 s), then opens the container:
   ``lease_s - tick`` to ``lease_s + look`` plus the opening. Target (issue 36): p99 <= 5 s.
5. Tail latency across hosts: lines appended every 10 ms through the owner, followed on
   the owner (the ceiling) and on another daemon (which forwards the poll).
6. Group commit across containers: 1 KiB PD appends by ``--group-writers`` (8) writer
   processes on one daemon holding as many containers, alternating ``--group-runs`` (3)
   times between all to one container and each to its own; the ratio of the two.
   Target (issue 36): the spread >= 0.8x the single container.
7. PostgreSQL connections: ``--many-containers`` (64) containers on 3 daemons, every
   daemon creating and appending in every container at once; the most connections each
   daemon held (from /proc), against the bound (its pool's two lanes, its leases'
   connection and its LISTEN: ``DAEMON_CONNECTIONS``) and a stock server's
   ``max_connections`` (100).
8. Forwarded appends: two daemons, every segment owned by daemon 0; 1 KiB PD appends
   for ``--seconds`` by writer processes in three shapes (one writer; ``--forward-writers``
   (8) on one segment; as many on as many segments), through the owner (the ceiling)
   and through daemon 1, which forwards each append to the owner's append listener,
   alternating ``--forward-runs`` (3) times; the worst ratio, and the CPU both daemons
   used per 1,000 appends. Target (issue 36): >= 0.8x in every shape. Bound: both
   daemons and every writer share this machine's cores, so a forwarded append costs a
   second daemon's CPU on the same cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness.figures import Check, Latency, percentile
from benchmarks.harness.mounts import serving
from benchmarks.harness.procfs import cpu_s
from benchmarks.harness.scenario import Report, alternate, table
from benchmarks.scale import probe_namespace
from tierfs.cluster.container_host import look_s, tick_s
from tierfs.cluster.container_map import container_of
from tierfs.contracts.config import StoreConfig
from tierfs.engine.metadata.connection_pool import DAEMON_CONNECTIONS, POOL_CONNECTIONS
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.record_types import Chunk, SegmentMeta
from tierfs.testing.cluster import Cluster
from tierfs.testing.postgres import PostgresServer

HELP = ("metadata latency on PostgreSQL vs SQLite, ls/stat as the namespace grows, append throughput "
        "with 1-3 cluster daemons, failover time, forwarded appends, connections, group commit")
CONTAINERS = 6
DEFAULT_LEASE_S = float(StoreConfig.lease_s)  # tierfs's own default
GROUP_COMMIT_TARGET = 0.8  # appends spread over a daemon's containers / the same to one container (issue 36)
FAILOVER_TARGET_S = 5.0  # p99, kill -9 -> first append accepted by the new owner (issue 36)
FORWARDED_TARGET = 0.8  # forwarded appends / the same through the owner, every shape (issue 36)
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


@contextmanager
def cluster(directory: Path, server: PostgresServer, name: str, daemons: int, lease_s: float = DEFAULT_LEASE_S,
            flush_interval_s: float = 0.2, containers: int = CONTAINERS,
            ) -> Iterator[tuple[Cluster, dict[int, str | None]]]:
    """``daemons`` cluster daemons on a new database, balanced: (the cluster, container owners)."""
    url = server.create_database()
    nodes = Cluster(directory / name, url, str(directory / f"{name}-tier2"), containers=containers, lease_s=lease_s,
                    flush_interval_s=flush_interval_s)
    try:
        for index in range(daemons):
            nodes.start(index)
        yield nodes, nodes.wait_balanced(list(range(daemons)))
    finally:
        nodes.stop_all()
        server.drop_database(url.rsplit("/", 1)[1])


def segment_of(nodes: Cluster, owners: dict[int, str | None], daemon: int, name: str, index: int = 0) -> str:
    """A segment name in the ``index``-th container (round robin) that ``daemon`` owns."""
    mine = [c for c, owner in owners.items() if owner == nodes.daemon_id(daemon)]
    container, top = mine[index % len(mine)], 0
    while container_of(f"b{top}", nodes.containers) != container:
        top += 1
    return f"b{top}/{name}"


def run_writers(targets: list[tuple[str, str]], seconds: float) -> float:
    """Appends per second summed over one writer process per (socket URL, name)."""
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, name, str(seconds)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for url, name in targets]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return sum(int(proc.communicate(timeout=seconds + 120)[0].strip()) for proc in procs) / seconds


def append_throughput(directory: Path, server: PostgresServer, writers: int, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    with serving(directory / "single", "flush_interval_s = 1.0\n") as single:
        client = single.client()
        for w in range(writers):
            client.create(f"w{w}")
        client.close()
        figures["single host"] = run_writers([(single.url, f"w{w}") for w in range(writers)], seconds)
    for daemons in (1, 2, 3):
        with cluster(directory, server, f"c{daemons}", daemons, flush_interval_s=1.0) as (nodes, owners):
            targets = []
            for index in range(daemons):
                client = nodes.client(index)
                for w in range(writers):
                    name = segment_of(nodes, owners, index, f"w{index}-{w}", w)
                    client.create(name, parents=True)
                    targets.append((nodes.daemons[index].url, name))
                client.close()
            figures[f"{daemons} daemon{'s' if daemons > 1 else ''}"] = run_writers(targets, seconds)
    return figures


def failover_times(directory: Path, server: PostgresServer, runs: int, lease_s: float) -> list[float]:
    times: list[float] = []
    with cluster(directory, server, "f", 1, lease_s) as (nodes, _):
        for run in range(runs):
            victim = run + 1  # a fresh data dir each time: a new host joins, then dies
            nodes.start(victim)
            owners = nodes.wait_balanced([0, victim], timeout_s=lease_s * 6 + 60)
            name = segment_of(nodes, owners, victim, f"failover-{run}")
            survivor = nodes.client(0)
            survivor.create(name, parents=True)
            survivor.append(name, b"before\n")
            nodes.daemons[victim].kill9()
            killed_at = time.monotonic()
            survivor.append(name, b"after\n")  # waits for the new owner
            times.append(time.monotonic() - killed_at)
            survivor.close()
    return times


def tail_latencies(directory: Path, server: PostgresServer, lines: int) -> dict[str, list[float]]:
    """Seconds from each append (through the owner) to a follower on the owner and on another daemon."""
    arrivals: dict[str, list[float]] = {"on the owner": [], "on another daemon": []}
    with cluster(directory, server, "tl", 2) as (nodes, owners):
        name = segment_of(nodes, owners, 0, "tail")
        writer = nodes.client(0)
        writer.create(name, parents=True)

        def follow(label: str, host: int) -> None:
            client, buffer = nodes.client(host), b""
            try:
                for piece in client.follow(name, 0, poll_timeout_s=5.0):
                    now = time.monotonic()
                    *complete, buffer = (buffer + piece).split(b"\n")
                    arrivals[label] += [now - float(line) for line in complete]
                    if len(arrivals[label]) >= lines:
                        return
            finally:
                client.close()

        followers = [threading.Thread(target=follow, args=(label, host), daemon=True)
                     for host, label in enumerate(arrivals)]
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


def connection_peaks(directory: Path, server: PostgresServer, containers: int, daemons: int = 3) -> list[int]:
    """The most PostgreSQL connections each daemon held while every daemon created and
    appended in every container (see section 7)."""
    url = server.create_database()
    nodes = Cluster(directory / "conn", url, str(directory / "conn-tier2"), containers=containers)
    try:
        with nodes.connection_peaks(int(url.rsplit(":", 1)[1].split("/", 1)[0])) as peaks:
            nodes.start_together(range(daemons))
            nodes.wait_balanced(list(range(daemons)))
            nodes.write_in_every_container(range(daemons))
    finally:
        nodes.stop_all()
        server.drop_database(url.rsplit("/", 1)[1])
    return [peaks.get(index, 0) for index in range(daemons)]


def group_commit(directory: Path, server: PostgresServer, writers: int, seconds: float,
                 runs: int) -> dict[str, list[float]]:
    """1 KiB PD appends by ``writers`` processes on one daemon holding ``writers``
    containers: all to segments of one container, and each to its own container's."""
    rates: dict[str, list[float]] = {"one container": [], "a container each": []}
    with cluster(directory, server, "gc", 1, flush_interval_s=1.0, containers=writers) as (nodes, owners):
        client = nodes.client(0)
        shapes = {"one container": [segment_of(nodes, owners, 0, f"same-{w}", 0) for w in range(writers)],
                  "a container each": [segment_of(nodes, owners, 0, f"own-{w}", w) for w in range(writers)]}
        for name in shapes["one container"] + shapes["a container each"]:
            client.create(name, parents=True)
        client.close()
        for run in range(runs):
            for shape in alternate(run, list(shapes)):
                rates[shape].append(run_writers([(nodes.daemons[0].url, name) for name in shapes[shape]], seconds))
    return rates


def forwarded_rates(directory: Path, server: PostgresServer, seconds: float, runs: int, writers: int,
                    ) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Section 8: per shape, the appends/s and the daemons' CPU-s per 1,000 appends,
    through the owner and forwarded, one figure per run."""
    one, many, spread = "1 writer", f"{writers} writers, one segment", f"{writers} writers, {writers} segments"
    shapes = {one: 1, many: writers, spread: writers}
    figures: dict[str, dict[str, dict[str, list[float]]]] = {
        shape: {"rate": {"owner": [], "forwarded": []}, "cpu_s_per_1000": {"owner": [], "forwarded": []}}
        for shape in shapes}
    with cluster(directory, server, "fw", 2, flush_interval_s=1.0) as (nodes, owners):
        client = nodes.client(0)
        names = {shape: [segment_of(nodes, owners, 0, f"s{s}-w{w}", w) for w in range(count)]
                 for s, (shape, count) in enumerate(shapes.items())}
        names[many] = [names[many][0]] * writers  # all on one segment
        for segment in {name for group in names.values() for name in group}:
            client.create(segment, parents=True)
        client.close()
        pids = [nodes.daemons[index].proc.pid for index in (0, 1)]
        for run in range(runs):
            for shape in shapes:
                for path in alternate(run, ["owner", "forwarded"]):
                    url = nodes.daemons[0 if path == "owner" else 1].url
                    before = sum(cpu_s(pid) for pid in pids)
                    rate = run_writers([(url, name) for name in names[shape]], seconds)
                    used = sum(cpu_s(pid) for pid in pids) - before
                    figures[shape]["rate"][path].append(rate)
                    figures[shape]["cpu_s_per_1000"][path].append(used / max(1.0, rate * seconds) * 1000)
    return figures


def forwarded_section(figures: dict[str, dict[str, dict[str, list[float]]]], seconds: float,
                      runs: int) -> tuple[list[str], list[Check]]:
    worst = {shape: min(f / o for f, o in zip(r["rate"]["forwarded"], r["rate"]["owner"], strict=True))
             for shape, r in figures.items()}
    rows = [[shape, f"{min(r['rate']['owner']):,.0f}..{max(r['rate']['owner']):,.0f}",
             f"{min(r['rate']['forwarded']):,.0f}..{max(r['rate']['forwarded']):,.0f}", f"{worst[shape]:.2f}",
             f"{max(r['cpu_s_per_1000']['owner']):.2f} / {max(r['cpu_s_per_1000']['forwarded']):.2f}"]
            for shape, r in figures.items()]
    section = table([f"forwarded appends, 1 KiB PD, {seconds:g} s x {runs} runs (appends/s)", "through the owner",
                     "forwarded", "worst ratio", "daemons' CPU-s per 1,000 (owner / forwarded)"], rows)
    return section, [Check(f"forwarded / owner, {shape} (worst of {runs})", worst[shape], FORWARDED_TARGET, True, "x")
                     for shape in figures]


def daemons_report(throughput: dict[str, float], failovers: list[float], lease_s: float, writers: int,
                   seconds: float, tails: dict[str, list[float]]) -> list[str]:
    lines = [f"1 KiB PD appends, {writers} writer processes per daemon, {seconds:g} s (appends/s)"]
    lines += [f"  {label:12} {rate:10,.0f}   {rate / throughput['single host']:5.2f}x the single-host daemon"
              for label, rate in throughput.items()]
    ordered, tick, look = sorted(failovers), tick_s(lease_s), look_s(lease_s)
    lines += [f"failover (kill -9 -> first append accepted by the new owner), {len(ordered)} runs, lease {lease_s:g} s: "
              f"p50 {percentile(ordered, 0.5):.2f} s, p99 {percentile(ordered, 0.99):.2f} s, max {ordered[-1]:.2f} s",
              f"  bound: lease expiry and its discovery {lease_s - tick:.2f}..{lease_s + look:.2f} s after the kill, "
              "plus opening the container"]
    owner, other = sorted(tails["on the owner"]), sorted(tails["on another daemon"])
    lines.append(f"tail -f latency, append through the owner -> line at a follower, {len(other)} lines (ms): "
                 f"on another daemon p50 {percentile(other, 0.5) * 1e3:.1f} p99 {percentile(other, 0.99) * 1e3:.1f}, "
                 f"on the owner (ceiling) p50 {percentile(owner, 0.5) * 1e3:.1f} p99 {percentile(owner, 0.99) * 1e3:.1f}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=300, help="metadata latency rounds")
    parser.add_argument("--small", type=int, default=10_000, help="segments in the small store")
    parser.add_argument("--large", type=int, default=1_000_000, help="segments in the large store")
    parser.add_argument("--large-dir", type=int, default=100_000, help="segments in the large store's big directory")
    parser.add_argument("--writers", type=int, default=2, help="appending client processes per daemon")
    parser.add_argument("--seconds", type=float, default=5.0, help="append throughput: seconds per configuration")
    parser.add_argument("--failovers", type=int, default=20, help="failover runs")
    parser.add_argument("--lease", type=float, default=DEFAULT_LEASE_S,
                        help="lease_s of the failover runs (default: tierfs's, %(default)g s)")
    parser.add_argument("--tail-lines", type=int, default=500, help="lines followed across hosts")
    parser.add_argument("--many-containers", type=int, default=64, help="containers of the connections section")
    parser.add_argument("--group-writers", type=int, default=8, help="writers (and containers) of the group commit section")
    parser.add_argument("--group-runs", type=int, default=3, help="alternations of the group commit section")
    parser.add_argument("--forward-writers", type=int, default=8, help="writers of the forwarded section's many-writer shapes")
    parser.add_argument("--forward-runs", type=int, default=3, help="alternations of the forwarded section")


def metadata_ops(meta: Any, round_number: int) -> dict[str, Callable[[], object]]:
    name, state = f"bench/r{round_number}", {}

    def create() -> None:
        state["row"] = meta.create_segment(name, "bench", SegmentMeta())

    def flush() -> None:
        row = state["row"]
        meta.commit_flush(row, dataclasses.replace(row.record, flushed_length=4096),
                          Chunk(name=f"s{row.segment_id}/e1-c0", segment_id=row.segment_id, length=4096))

    def smallest_commit() -> None:
        with meta.database.transaction():
            meta.database.execute("INSERT INTO store (key, value) VALUES ('bench', ?) "
                                  "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (b"x",))

    return {"create": create, "stat (row by name)": lambda: meta.find_segment(name), "flush commit": flush,
            "bound: SELECT 1": lambda: meta.database.execute("SELECT 1").fetchone(),
            "bound: smallest commit": smallest_commit}


def metadata_latency(directory: Path, rounds: int) -> dict[str, dict[str, Latency]]:
    with PostgresServer(durable=True) as server:
        stores = {"sqlite": MetadataStore.sqlite(directory / "latency.sqlite"),
                  "postgresql": MetadataStore.open(server.create_database("bench"), directory / "unused")}
        samples: dict[str, dict[str, list[float]]] = {backend: {} for backend in stores}
        for meta in stores.values():
            meta.mkdir("bench", "")
        for round_number in range(rounds):
            for backend in alternate(round_number, list(stores)):
                for op, call in metadata_ops(stores[backend], round_number).items():
                    started = time.perf_counter()
                    call()
                    samples[backend].setdefault(op, []).append(time.perf_counter() - started)
        for meta in stores.values():
            meta.close()
    return {backend: {op: Latency.of(values) for op, values in ops.items()} for backend, ops in samples.items()}


def measure(directory: Path, args: argparse.Namespace) -> Report:
    latency = metadata_latency(directory, args.rounds)
    scaling = {label: probe_namespace(directory, total, big)
               for label, total, big in (("small", args.small, args.small - 10), ("large", args.large, args.large_dir))}
    with PostgresServer() as server:  # appends never touch the metadata; leases do
        throughput = append_throughput(directory, server, args.writers, args.seconds)
        failovers = failover_times(directory, server, args.failovers, args.lease)
        tails = tail_latencies(directory, server, args.tail_lines)
        peaks = connection_peaks(directory, server, args.many_containers)
        grouped = group_commit(directory, server, args.group_writers, args.seconds, args.group_runs)
        forwarded = forwarded_rates(directory, server, args.seconds, args.forward_runs, args.forward_writers)
    forwarded_table, forwarded_checks = forwarded_section(forwarded, args.seconds, args.forward_runs)
    rows = [[op, f"{s.p50_us:.0f} / {s.p99_us:.0f}", f"{pg.p50_us:.0f} / {pg.p99_us:.0f}", f"{pg.p50_us / s.p50_us:.2f}"]
            for op, s in latency["sqlite"].items() for pg in [latency["postgresql"][op]]]
    small, large = scaling["small"], scaling["large"]
    lines = ["namespace scaling (in-process store, SQLite)"]
    for label, f in scaling.items():
        lines.append(f"  {label}: {f['segments']:,} segments: open {f['open_s']:.1f} s, RSS "
                     f"{f['rss_after_open_bytes'] / 2**20:.0f} MiB, stat p50/p99 {f['stat_cold']['p50_us']:.1f}/"
                     f"{f['stat_cold']['p99_us']:.1f} µs, ls of 10 p50 {f['ls_small']['p50_us']:.1f} µs, ls of "
                     f"{f['ls_big_entries']:,} {f['ls_big_s'] * 1e3:.0f} ms "
                     f"({f['ls_big_s'] / f['ls_big_entries'] * 1e6:.2f} µs/entry)")
    per_entry = (large["ls_big_s"] / large["ls_big_entries"]) / (small["ls_big_s"] / small["ls_big_entries"])
    lines.append(f"  large/small ({large['segments'] / small['segments']:.0f}x segments): stat p50 "
                 f"{large['stat_cold']['p50_us'] / small['stat_cold']['p50_us']:.2f}x, ls of 10 "
                 f"{large['ls_small']['p50_us'] / small['ls_small']['p50_us']:.2f}x, ls per entry {per_entry:.2f}x, open "
                 f"{large['open_s'] / small['open_s']:.0f}x")
    bound = DAEMON_CONNECTIONS
    sections = [table([f"metadata latency, {args.rounds} rounds (p50 / p99 µs)", "SQLite", "PostgreSQL",
                       "PG/SQLite p50"], rows), lines,
                daemons_report(throughput, failovers, args.lease, args.writers, args.seconds, tails),
                [f"PostgreSQL connections, {args.many_containers} containers on {len(peaks)} daemons, all writing: "
                 f"most held per daemon {' / '.join(map(str, peaks))} (bound {bound} each: pool "
                 f"{POOL_CONNECTIONS} + event-loop reads + leases + LISTEN), {sum(peaks)} in all of a stock server's 100",
                 f"group commit, 1 KiB PD appends by {args.group_writers} writers on one daemon ({args.seconds:g} s x "
                 f"{args.group_runs}, appends/s): all to one container {min(grouped['one container']):,.0f}.."
                 f"{max(grouped['one container']):,.0f}, each to its own {min(grouped['a container each']):,.0f}.."
                 f"{max(grouped['a container each']):,.0f}"], forwarded_table]
    at = "the default lease" if args.lease == DEFAULT_LEASE_S else f"lease {args.lease:g} s (not the default)"
    checks = [Check(f"failover p99 at {at}", percentile(sorted(failovers), 0.99), FAILOVER_TARGET_S, False, "s",
                    max(failovers) if len(failovers) > 1 else None),
              Check("PostgreSQL connections, most held by one daemon", max(peaks), bound, False, ""),
              Check(f"group commit: {args.group_writers} containers / one (worst of {args.group_runs})",
                    min(a / b for a, b in zip(grouped["a container each"], grouped["one container"], strict=True)),
                    GROUP_COMMIT_TARGET, True, "x"), *forwarded_checks]
    return Report("cluster benchmark", sections, checks, {"metadata_latency": latency, "namespace": scaling,
                                                      "append_throughput": throughput, "failovers_s": failovers,
                                                      "tail_latencies_s": tails, "connection_peaks": peaks,
                                                      "group_commit": grouped, "forwarded": forwarded})

