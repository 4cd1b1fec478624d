"""fsspec benchmark: reads through ``tierfs://`` in another process next to their
ceilings, and small reads and appends through the daemon next to the engine in-process.

Set-up: a daemon (``tierfs serve`` by the shared harness; ``TIERFS_*`` left out, no
``-v``; a block cache of 1.25 x the segment) gets a segment of ``--size-mib`` (256) MiB
of seeded bytes through its API (4 MiB PD appends), flushed and read once (its cache
then holds every block); the same bytes go into a store opened in this process. The
fsspec side runs in a child process (``child.py``), which checks the segment's hash
first. ``--rounds`` (5) rounds, each row the median, each ratio the median of the rounds':

- (r) the ceiling of (a), in the child: every chunk file's 1 MiB blocks ``pread`` and
  checked against the layout's CRC32C; (r) and (a) run three times each, taking turns,
  and the fastest of each counts (a scan takes tens of milliseconds);
- (a) ``fsspec.open("tierfs://...", "rb")``, ``f.read(1 MiB)`` until EOF (the flushed
  bytes read from the chunk files, one ``pread`` and CRC check per block);
- (c) the ceiling of (d): a raw Unix-socket stream from this process to the child;
- (d) as (a) with ``direct_reads=False``: every block through the daemon.

Then 4 KiB ``fs.cat_file`` at 2,000 seeded offsets next to the engine's reads here, and
``--appends`` (2,000) timed 1 KiB appends (after 100 untimed) by ``TierClient.append``
next to ``store.append``, PD and VD; then the write rounds (``writes.py``). Target (issue
4, its reference replaced in issue 19): (a) / (r) >= 0.60. A ``cat_file`` call costs one
request to the daemon (about 1 ms here) whatever its size: the small reads show it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import random
import socket
import sys
import threading
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio

from benchmarks.fsspec import writes as fsspec_writes
from benchmarks.harness import procfs
from benchmarks.harness.child import JsonLineChild
from benchmarks.harness.figures import (
    Check,
    Latency,
    MiB,
    Throughput,
    make_payload,
    ratios,
    spread,
    warm_cache_bytes,
)
from benchmarks.harness.scenario import (
    Report,
    add_scratch_arguments,
    at_least_one,
    run_scenario,
    table,
)
from benchmarks.harness.stores import random_reads, sequential_scan, write_segment, write_via_client

HELP = "warm sequential reads via fsspec in another process and 1 KiB appends via the HTTP API vs the engine in-process"
SEGMENT = "bench/read"
PAIR_REPEATS = 3
STOP_TIMEOUT_S = 60.0  # the daemon flushes before it exits
LABELS = {"a": "(a) fsspec.open rb, f.read(1 MiB), direct", "r": "(r) ceiling: pread + CRC32C of each 1 MiB block",
          "d": "(d) as (a), direct_reads=False: all via daemon", "c": "(c) raw Unix socket, 2 processes, 1 MiB pieces"}


def fsspec_scan(child: JsonLineChild, daemon: Any, op: str, **args: Any) -> dict[str, Any]:
    daemon_before = procfs.cpu_s(daemon.pid)
    figures = child.request({"op": op, **args})
    return {**figures, "daemon_cpu_s": procfs.cpu_s(daemon.pid) - daemon_before}


def socket_ceiling(child: JsonLineChild, directory: Path, payload: bytes) -> dict[str, Any]:
    """(c): this process sends the payload over a Unix socket; the child receives it."""
    path = directory / "ceiling.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)

        def send() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.sendall(payload)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        figures = child.request({"op": "socket_sink", "path": str(path), "size": len(payload), "piece": MiB})
        sender.join()
    path.unlink()
    return figures


async def measure_round(child: JsonLineChild, daemon: Any, directory: Path, payload: bytes
                        ) -> dict[str, dict[str, Any]]:
    found = {}
    found["c"] = await trio.to_thread.run_sync(socket_ceiling, child, directory, payload)
    scans: dict[str, list[dict[str, Any]]] = {"r": [], "a": []}
    for index in range(PAIR_REPEATS):  # taking turns; the fastest of each counts
        for key in ("r", "a") if index % 2 == 0 else ("a", "r"):
            op, options = ("scan_pread", {}) if key == "r" else ("scan_open", {"read_bytes": MiB})
            scans[key].append(await trio.to_thread.run_sync(functools.partial(fsspec_scan, child, daemon, op, **options)))
    found.update({key: min(values, key=lambda scan: scan["seconds"]) for key, values in scans.items()})
    found["d"] = await trio.to_thread.run_sync(lambda: fsspec_scan(child, daemon, "scan_open", read_bytes=MiB,
                                                                   direct=False))
    return found


def api_appends(url: str, segment: str, durability: str, count: int) -> Latency:
    from tierfs.remote.client import TierClient

    client = TierClient(url)
    try:
        client.create(segment, durability=durability, parents=True)
        latencies_s = []
        for _ in range(100 + count):
            start_s = perf_counter()
            client.append(segment, b"a" * 1024)
            latencies_s.append(perf_counter() - start_s)
    finally:
        client.close()
    return Latency.of(latencies_s[100:])


async def engine_appends(store: Any, segment: str, durability: str, count: int) -> Latency:
    await store.create(segment, durability=durability, make_parents=True)
    latencies_s = []
    for _ in range(100 + count):
        start_s = perf_counter()
        await store.append(segment, b"a" * 1024)
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s[100:])


async def measure_in_process(directory: Path, args: argparse.Namespace, payload: bytes, daemon: Any,
                             child: JsonLineChild, log: TextIO) -> dict[str, Any]:
    from tierfs import StoreConfig, open_store

    config = StoreConfig(data_dir=directory / "engine", block_cache_bytes=warm_cache_bytes(len(payload)))
    found: dict[str, Any] = {"rounds": [], "appends": {}}
    async with open_store(config) as store:
        print("writing the same bytes in-process ...", file=log, flush=True)
        await write_segment(store, SEGMENT, payload, 4 * MiB)
        await sequential_scan(store, SEGMENT, len(payload), 4 * MiB, expected=payload)
        misses = (await trio.to_thread.run_sync(daemon.metrics))["tierfs_cache_misses_total"], store.block_cache.misses
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}: (c), (r), (a), (d) ...", file=log, flush=True)
            found["rounds"].append(await measure_round(child, daemon, directory, payload))
        rng = random.Random(4)
        offsets = [rng.randrange(len(payload) // 4096) * 4096 for _ in range(2000)]
        found["small_api"] = Latency(**child.request({"op": "small_reads", "offsets": offsets, "length": 4096}))
        found["small_engine"] = await random_reads(store, SEGMENT, len(payload), 2000, seed=4)
        metrics = await trio.to_thread.run_sync(daemon.metrics)
        found["misses"] = (metrics["tierfs_cache_misses_total"] - misses[0], store.block_cache.misses - misses[1])
        print(f"appends: {args.appends} x 1 KiB per case ...", file=log, flush=True)
        for durability in ("pd", "vd"):
            segment = f"bench/append-{durability}"
            found["appends"][f"API {durability.upper()} TierClient.append"] = await trio.to_thread.run_sync(
                api_appends, daemon.url, segment, durability, args.appends)
            found["appends"][f"engine {durability.upper()} await store.append"] = await engine_appends(
                store, segment, durability, args.appends)
        if args.write_rounds:
            found["writes"] = await fsspec_writes.measure_writes(store, daemon, directory, args.write_mib * MiB,
                                                                 args.write_rounds, log)
    return found


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs.testing.harness import process_environment, start_daemon

    at_least_one(args, "size_mib", "rounds", "appends", "write_mib", *(["write_rounds"] if args.writes_only else []))
    log, size = sys.stderr, args.size_mib * MiB
    (directory / "daemon.toml").write_text(f"block_cache_bytes = {warm_cache_bytes(size)}\n")
    daemon = start_daemon(directory / "daemon", config_file=directory / "daemon.toml", drop_tierfs_env=True,
                          log_path=directory / "daemon.log", verbose=False)
    try:
        if args.writes_only:
            return report_writes(trio.run(_writes_alone, directory, daemon, args, log), args)
        payload = make_payload(size, 4)
        print(f"daemon serving {daemon.socket}; writing {args.size_mib} MiB through the API ...", file=log, flush=True)
        client = daemon.client()
        write_via_client(client, SEGMENT, payload)
        for offset in range(0, size, 4 * MiB):  # fills the daemon's block cache
            if client.read(SEGMENT, offset, min(size, offset + 4 * MiB)) != payload[offset:offset + 4 * MiB]:
                raise RuntimeError(f"the daemon returned other bytes at {offset}")
        client.close()
        env = process_environment({"TIERFS_DATA_DIR": str(daemon.data_dir)}, drop_tierfs=True)
        child = JsonLineChild("benchmarks.fsspec.child", SEGMENT, log_path=directory / "child.log", env=env)
        try:
            child.answer()  # ready
            check = child.request({"op": "hash", "read_bytes": MiB})
            if check["sha256"] != hashlib.sha256(payload).hexdigest() or check["nbytes"] != size:
                raise RuntimeError("fsspec read other bytes than were appended")
            found = trio.run(measure_in_process, directory, args, payload, daemon, child, log)
        finally:
            child.close()
    finally:
        code, _ = daemon.stop(timeout_s=STOP_TIMEOUT_S)
    return report(found, args, code)


async def _writes_alone(directory: Path, daemon: Any, args: argparse.Namespace, log: TextIO) -> list[dict[str, Any]]:
    from tierfs import StoreConfig, open_store

    async with open_store(StoreConfig(data_dir=directory / "engine")) as store:
        return await fsspec_writes.measure_writes(store, daemon, directory, args.write_mib * MiB, args.write_rounds,
                                                  log)


def report_writes(writes: list[dict[str, Any]], args: argparse.Namespace) -> Report:
    return Report(f"fsspec writes: {args.write_mib} MiB per case, 8 MiB appends, PD",
                  [fsspec_writes.format_writes(writes, args.write_mib * MiB)], fsspec_writes.write_checks(writes),
                  {"writes": writes})


def report(found: dict[str, Any], args: argparse.Namespace, daemon_exit_code: int) -> Report:
    rounds, size = found["rounds"], args.size_mib * MiB

    def column(key: str) -> list[Throughput]:
        return [Throughput(LABELS[key], r[key]["nbytes"], r[key]["seconds"]) for r in rounds]

    rows = [[LABELS[key], *spread(column(key))] for key in LABELS]
    per_round = []
    for index, r in enumerate(rounds, 1):
        mb = {key: r[key]["nbytes"] / r[key]["seconds"] / 1e6 for key in r}
        per_round.append(f"round {index}: " + ", ".join(f"({key}) {mb[key]:,.1f}" for key in LABELS) + " MB/s; (a)/(r) "
                         f"{mb['a'] / mb['r']:.3f}, (d)/(c) {mb['d'] / mb['c']:.3f}; wall / CPU daemon + child, s: "
                         + "; ".join(f"({key}) {r[key]['seconds']:.3f} / {r[key]['daemon_cpu_s']:.2f} + "
                                     f"{r[key]['cpu_s']:.2f}" for key in ("a", "r", "d")))
    last = rounds[-1]
    api, engine = found["small_api"], found["small_engine"]
    details = [
        "bytes fetched / segment (last round): " + ", ".join(
            f"({key}) {last[key]['fetched_direct_bytes'] / size:.3f} direct + "
            f"{last[key]['fetched_daemon_bytes'] / size:.3f} daemon" for key in ("a", "d")),
        f"block cache misses during the rounds: daemon {found['misses'][0]:.0f}, engine {found['misses'][1]}",
        f"4 KiB reads at {api.samples:,} random offsets: fs.cat_file via daemon {api.text()}; engine {engine.text()}",
        f"daemon stopped by SIGTERM: exit code {daemon_exit_code}"]
    appends = table(["append 1 KiB, sequential", "p50 us", "p99 us", "max us"],
                    [[label, lat.p50_us, lat.p99_us, lat.max_us] for label, lat in found["appends"].items()])
    lat = list(found["appends"].values())
    appends += [f"{d} API / engine: p50 {api_.p50_us / eng.p50_us:.2f} x (+{api_.p50_us - eng.p50_us:,.1f} us), p99 "
                f"{api_.p99_us / eng.p99_us:.2f} x" for d, api_, eng in (("PD", lat[0], lat[1]), ("VD", lat[2], lat[3]))]
    sections = [table(["measurement", "MB/s", "min", "max"], rows), per_round, details, appends]
    checks = [Check.over("(a) / (r) fsspec.open vs pread + CRC", ratios(column("a"), column("r")), 0.60, True)]
    if "writes" in found:
        sections.append(fsspec_writes.format_writes(found["writes"], args.write_mib * MiB))
        checks += fsspec_writes.write_checks(found["writes"])
    title = (f"fsspec benchmark: {args.size_mib} MiB warm segment; daemon over its Unix socket; MB/s, median of "
             f"{args.rounds} rounds; (a), (b), (d) in a child process through fsspec, (a'), (b') in this process")
    return Report(title, sections, checks, found)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mib", type=int, default=256, help="segment size in MiB (default 256)")
    parser.add_argument("--rounds", type=int, default=5, help="read rounds (default 5; medians)")
    parser.add_argument("--appends", type=int, default=2000, help="timed 1 KiB appends per case (default 2000)")
    parser.add_argument("--write-mib", type=int, default=256, help="bytes written per write case, MiB (default 256)")
    parser.add_argument("--write-rounds", type=int, default=3, help="write rounds (default 3; 0: none)")
    parser.add_argument("--writes-only", action="store_true", help="only the write rounds (no reads, no 1 KiB appends)")
    add_scratch_arguments(parser, "daemon and engine data dirs")


def run(args: argparse.Namespace) -> int:
    return run_scenario("fsspec", args, lambda directory: measure(directory, args))
