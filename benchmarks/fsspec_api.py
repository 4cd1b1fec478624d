"""fsspec benchmark: reads and appends through the daemon's HTTP API next to the engine.

One run, in a fresh scratch directory ``tmp-tierfs-bench-*`` under ``--dir`` (default:
the current directory; RAM filesystems are refused), removed at the end:

Set-up. A real daemon, ``python -m tierfs.cli --data-dir <scratch>/daemon --config
<scratch>/daemon.toml serve``, started by the shared harness
(``tierfs.testing.harness.start_daemon``; ``TIERFS_*`` variables removed from its
environment, so only the TOML file and the defaults apply; no ``-v``), which waits for
``<scratch>/daemon/tierfs.sock`` to answer ``/v1/health``. The TOML file sets
``block_cache_bytes`` = max(300 MiB, 1.25 x segment), so the daemon's block cache holds
the whole segment (the default 256 MiB would be just too small for a 256 MiB segment).
A segment of ``--size-mib`` MiB (default 256) of seeded random bytes is appended through
the API (``TierClient.append``, 4 MiB pieces, PD), flushed to tier-2
(``client.op("flush")``), then read once through the API (4 MiB ranges, compared with the
bytes appended), so the daemon's block cache holds every block. The same bytes go into a
second store opened in this process, ``open_store(StoreConfig(data_dir=<scratch>/engine,
block_cache_bytes=<same>))``, by ``await store.append`` in 4 MiB pieces, ``await
store.flush()`` and one verifying read: the engine's figures are measured on an
equivalent warm segment (the daemon owns its data dir, so the engine cannot open it).

Reads (``--rounds`` rounds, default 5; each row is the median of the rounds and each
ratio the median of the rounds' own ratios). The fsspec side runs in a **child
process** (``python -m benchmarks.fsspec_child --child``, with ``TIERFS_DATA_DIR`` set to
the daemon's data dir and no ``TIERFS_URL``): it imports fsspec, creates its
``TierFileSystem`` and reads the whole segment once, hashing it (untimed; the hash is
compared with the payload's) before the rounds. Only the reading is timed, never the
import, the connection or the open. Per round, in this order:

- (c) context: a raw Unix-socket stream between this process and the child, 1 MiB
  ``sendall`` / ``recv_into`` a new 1 MiB ``bytearray``: what any protocol that moves
  the bytes through a socket between two Python processes can reach at best;
- (r) the ceiling of (a), in the child: with the layout (asked once, untimed) every
  chunk file opened once and each whole 1 MiB block ``pread`` and checked against the
  layout's CRC32C, handed out one by one (``benchmarks/fsspec_child.py``): the work a
  verified direct read cannot avoid; (r) and (a) run three times each, taking turns,
  and the fastest of each counts (a scan takes tens of milliseconds: one scheduling
  delay from another tenant would otherwise decide the figure);
- (a) fsspec: ``f = fsspec.open("tierfs://<segment>", "rb").open()`` (untimed; it stats
  the segment), then ``f.read(1 MiB)`` until EOF (the plugin's 1 MiB block cache; the
  flushed bytes are read straight from the chunk files, one ``pread`` and one CRC32C
  check per block, after one layout request to the daemon);
- (a') engine: ``reader = store.open_reader(name)``, ``await reader.read(offset, 1 MiB)``
  from 0 to the end (this process, warm cache);
- (b) fsspec: ``fs.cat_file(path, start, start + 4 MiB)`` over the segment (no block
  cache; each call asks the daemon for the layout, then reads the chunk files);
- (b') engine: as (a') with 4 MiB reads;
- (d) fsspec as (a) with ``direct_reads=False``: every block one ranged GET through the
  daemon (the path of a client that cannot reach the chunk files).

For (a) and (b) the CPU time of the daemon (``/proc/<pid>/stat``) and of the child
(``os.times``) during the scan is reported: their sum close to the wall time means the
two processes take turns rather than overlap. The daemon's ``/metrics`` counters before
and after the rounds show whether any read missed its block cache (it should not).

Then, once: 4 KiB reads at 2,000 seeded random 4 KiB-aligned offsets, each timed, through
``fs.cat_file`` in the child and through ``reader.read`` in this process: the fixed cost
of one request.

Appends: ``--appends`` (default 2,000) sequential 1 KiB appends, each timed, after 100
untimed ones, by ``TierClient.append`` from this process to a PD segment and to a VD
segment of the daemon (one keep-alive connection), and by ``await store.append`` to a PD
and a VD segment of the in-process store; in the order API PD, engine PD, API VD, engine
VD. Reported: p50, p99, max, the API / engine ratios and the difference in µs.

Writes (issue 19 item 5, ``benchmarks/fsspec_writes.py`` has the details): per write round
(``--write-rounds``, default 3), ``--write-mib`` MiB (default 256) written through
``tierfs://`` in ``wb`` and in ``ab`` (``f.write`` of 1 MiB, so 8 MiB appends, PD),
next to the engine in-process appending the same bytes in 8 MiB appends and to
``os.write`` + ``fdatasync`` of 8 MiB pieces on the same disk; both stores flush
everything and ``sync`` runs before each case (untimed); each fsspec segment is read back
and compared.
``--writes-only`` runs just these rounds, on a daemon and a store of their own.

Finally the daemon is stopped with SIGTERM (its exit code is reported) and the child
and the scratch directory are removed.

Target (issue 4, reference replaced in issue 19 item 7): (a) / (r) >= 0.60, a sequential
read through fsspec against pread + CRC32C of the same blocks in the same process. The
engine's warm read (a') was the reference before; it is no bound on (a), which never
touches the engine (it hands out cached blocks without a copy), so (a) / (a') is
reported as context only. (b) and (d)
are reported without a target: a ``cat_file`` call costs one request to the daemon
(about 1 ms here) whatever its size. There is no target on append latency; its ratio is
reported. Writes: (wb) / (e) and (ab) / (e) >= 0.7, ``tierfs://`` against the engine
in-process. A missed target is reported, not an error: the
exit code is 0 either way (1 only if the daemon or the child cannot run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import random
import socket
import statistics
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio

from benchmarks import fsspec_writes
from benchmarks.common import (
    EXIT_USAGE,
    Check,
    Latency,
    MiB,
    Throughput,
    add_scratch_arguments,
    checks_json,
    format_checks,
    make_payload,
    print_sections,
    run_in_scratch,
    warm_cache_bytes,
)
from benchmarks.fsspec_child import Child
from benchmarks.fsspec_writes import WriteResults
from tierfs import StoreConfig, open_store
from tierfs.contracts.info import SegmentInfo
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import Daemon, HarnessError, start_daemon

HELP = "warm sequential reads via fsspec in another process and 1 KiB appends via the HTTP API vs the engine in-process"

SEGMENT = "bench/read"
PD_SEGMENT = "bench/append-pd"
VD_SEGMENT = "bench/append-vd"
WRITE_PIECE_BYTES = 4 * MiB  # appends that build the segment; also the warm-up reads
OPEN_READ_BYTES = MiB  # f.read() size on the fsspec file, (a) and (a')
CAT_RANGE_BYTES = 4 * MiB  # fs.cat_file range, (b) and (b')
SOCKET_PIECE_BYTES = MiB  # (c)
SMALL_READ_BYTES = 4096
SMALL_READS = 2000
APPEND_BYTES = 1024
APPEND_WARMUP = 100
TARGET_RATIO = 0.60
PAIR_REPEATS = 3  # (r) and (a) per round, best of each (see best_of_pairs)
SEED = 4
STOP_TIMEOUT_S = 60.0  # the daemon flushes before it exits
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------- figures
@dataclasses.dataclass(frozen=True)
class Scan:
    """One timed sequential read of the whole segment."""

    throughput: Throughput
    daemon_cpu_s: float | None = None  # CPU the daemon used meanwhile (fsspec scans)
    client_cpu_s: float | None = None  # CPU the reading child used meanwhile
    fetched_daemon_bytes: int | None = None  # bytes the fsspec instance got from the daemon
    fetched_direct_bytes: int | None = None  # bytes it read from chunk files itself


@dataclasses.dataclass(frozen=True)
class Round:
    socket_ceiling: Throughput  # (c)
    pread_ceiling: Scan  # (r): pread + CRC32C of the same blocks, in the child
    fsspec_open: Scan  # (a)
    engine_open: Scan  # (a')
    fsspec_open_daemon: Scan  # (d)
    fsspec_cat: Scan  # (b)
    engine_cat: Scan  # (b')

    @property
    def ceiling_ratio(self) -> float:
        """(a) / (r): the fsspec read against its ceiling."""
        return self.fsspec_open.throughput.mb_per_s / self.pread_ceiling.throughput.mb_per_s

    @property
    def open_ratio(self) -> float:
        return self.fsspec_open.throughput.mb_per_s / self.engine_open.throughput.mb_per_s

    @property
    def daemon_open_ratio(self) -> float:
        return self.fsspec_open_daemon.throughput.mb_per_s / self.engine_open.throughput.mb_per_s

    @property
    def cat_ratio(self) -> float:
        return self.fsspec_cat.throughput.mb_per_s / self.engine_cat.throughput.mb_per_s


@dataclasses.dataclass(frozen=True)
class AppendCase:
    label: str
    via: str  # "api" or "engine"
    durability: str
    latency: Latency
    appends_per_s: float


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    cache_bytes: int
    rounds: list[Round]
    daemon_cache_misses_during_rounds: int
    daemon_cache_bytes: int
    engine_cache_misses_during_rounds: int
    small_reads_api: Latency
    small_reads_engine: Latency
    appends: dict[str, AppendCase]  # key: "<via>_<durability>"
    writes: WriteResults | None = None  # None with --write-rounds 0
    daemon_exit_code: int | None = None

    def median(self, pick: Callable[[Round], Throughput]) -> float:
        return statistics.median(pick(r).mb_per_s for r in self.rounds)

    def spread(self, pick: Callable[[Round], Throughput]) -> tuple[float, float]:
        values = [pick(r).mb_per_s for r in self.rounds]
        return min(values), max(values)


# ----------------------------------------------------------------------- daemon
def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


# ----------------------------------------------------------------- measurements
def write_through_api(daemon: Daemon, payload: bytes) -> None:
    """The segment by 4 MiB appends, flushed, then read once (fills the daemon's cache)
    and compared with the payload."""
    client = daemon.client()
    try:
        client.create(SEGMENT, parents=True)
        view = memoryview(payload)
        for offset in range(0, len(payload), WRITE_PIECE_BYTES):
            client.append(SEGMENT, bytes(view[offset : offset + WRITE_PIECE_BYTES]), offset)
        client.op("flush", path=SEGMENT)
        info = client.stat(SEGMENT)
        assert isinstance(info, SegmentInfo)
        if info.flushed_length != len(payload):
            raise RuntimeError(f"the daemon flushed {info.flushed_length} of {len(payload)} bytes")
        for offset in range(0, len(payload), WRITE_PIECE_BYTES):
            end = min(len(payload), offset + WRITE_PIECE_BYTES)
            if client.read(SEGMENT, offset, end) != view[offset:end]:
                raise RuntimeError(f"the daemon returned other bytes at {offset}")
    finally:
        client.close()


async def write_in_process(store: SegmentStore, payload: bytes) -> None:
    """The same segment in the in-process store, flushed, read once and compared."""
    await store.create(SEGMENT, make_parents=True)
    view = memoryview(payload)
    for offset in range(0, len(payload), WRITE_PIECE_BYTES):
        await store.append(SEGMENT, view[offset : offset + WRITE_PIECE_BYTES])
    await store.flush(SEGMENT)
    info = await store.stat(SEGMENT)
    assert isinstance(info, SegmentInfo)
    if info.flushed_length != len(payload):
        raise RuntimeError(f"the store flushed {info.flushed_length} of {len(payload)} bytes")
    reader = store.open_reader(SEGMENT)
    for offset in range(0, len(payload), WRITE_PIECE_BYTES):
        data = await reader.read(offset, WRITE_PIECE_BYTES)
        if data != view[offset : offset + len(data)] or not data:
            raise RuntimeError(f"the store returned other bytes at {offset}")


async def engine_scan(store: SegmentStore, size: int, read_bytes: int, label: str) -> Scan:
    reader = store.open_reader(SEGMENT)
    offset = 0
    start_s = perf_counter()
    while offset < size:
        data = await reader.read(offset, read_bytes)
        if not data:
            raise RuntimeError(f"read at {offset} of {size} returned nothing")
        offset += len(data)
    return Scan(Throughput.of(label, offset, perf_counter() - start_s))


async def fsspec_scan(child: Child, daemon: Daemon, op: str, label: str, **args: Any) -> Scan:
    daemon_before = process_cpu_s(daemon.pid)
    figures = await trio.to_thread.run_sync(lambda: child.call(op, **args))
    daemon_cpu_s = process_cpu_s(daemon.pid) - daemon_before
    return Scan(
        Throughput.of(label, figures["nbytes"], figures["seconds"]),
        daemon_cpu_s=daemon_cpu_s,
        client_cpu_s=figures["cpu_s"],
        fetched_daemon_bytes=figures["fetched_daemon_bytes"],
        fetched_direct_bytes=figures["fetched_direct_bytes"],
    )


def socket_ceiling(child: Child, directory: Path, payload: bytes) -> Throughput:
    """(c): this process sends the payload over a Unix socket; the child receives it."""
    path = directory / "ceiling.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(1)
        errors: list[BaseException] = []

        def send() -> None:
            try:
                connection, _ = listener.accept()
                with connection:
                    view = memoryview(payload)
                    for offset in range(0, len(view), SOCKET_PIECE_BYTES):
                        connection.sendall(view[offset : offset + SOCKET_PIECE_BYTES])
            except BaseException as e:  # reported after the join
                errors.append(e)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        figures = child.call("socket_sink", path=str(path), size=len(payload), piece=SOCKET_PIECE_BYTES)
        sender.join()
    path.unlink()
    if errors:
        raise errors[0]
    label = f"(c) raw Unix socket, 2 processes, {SOCKET_PIECE_BYTES // MiB} MiB pieces"
    return Throughput.of(label, figures["nbytes"], figures["seconds"])


LABELS = {
    "r": "(r) ceiling: pread + CRC32C of each 1 MiB block",
    "a": f"(a) fsspec.open rb, f.read({OPEN_READ_BYTES // MiB} MiB), direct",
    "a'": f"(a') engine in-process, reader.read({OPEN_READ_BYTES // MiB} MiB)",
    "b": f"(b) fs.cat_file, {CAT_RANGE_BYTES // MiB} MiB ranges, direct",
    "b'": f"(b') engine in-process, reader.read({CAT_RANGE_BYTES // MiB} MiB)",
    "d": "(d) as (a), direct_reads=False: all via daemon",
}


async def best_of_pairs(child: Child, daemon: Daemon) -> tuple[Scan, Scan]:
    """(r) and (a), PAIR_REPEATS times each, taking turns which goes first: the
    fastest scan of each. A scan of the warm segment takes tens of milliseconds, so one
    scheduling delay of another tenant's process can halve a single figure."""
    pread: list[Scan] = []
    opened: list[Scan] = []
    for index in range(PAIR_REPEATS):
        for which in (("r", "a") if index % 2 == 0 else ("a", "r")):
            if which == "r":
                pread.append(await fsspec_scan(child, daemon, "scan_pread", LABELS["r"]))
            else:
                opened.append(await fsspec_scan(child, daemon, "scan_open", LABELS["a"], read_bytes=OPEN_READ_BYTES))

    def best(scans: list[Scan]) -> Scan:
        return min(scans, key=lambda scan: scan.throughput.seconds)

    return best(pread), best(opened)


async def measure_round(
    store: SegmentStore, child: Child, daemon: Daemon, directory: Path, payload: bytes
) -> Round:
    size = len(payload)
    ceiling = await trio.to_thread.run_sync(socket_ceiling, child, directory, payload)
    pread_ceiling, fsspec_open = await best_of_pairs(child, daemon)
    engine_open = await engine_scan(store, size, OPEN_READ_BYTES, LABELS["a'"])
    fsspec_open_daemon = await fsspec_scan(
        child, daemon, "scan_open", LABELS["d"], read_bytes=OPEN_READ_BYTES, direct=False
    )
    fsspec_cat = await fsspec_scan(
        child, daemon, "scan_cat", LABELS["b"], range_bytes=CAT_RANGE_BYTES, size=size
    )
    engine_cat = await engine_scan(store, size, CAT_RANGE_BYTES, LABELS["b'"])
    return Round(ceiling, pread_ceiling, fsspec_open, engine_open, fsspec_open_daemon, fsspec_cat, engine_cat)


def small_read_offsets(size: int) -> list[int]:
    rng = random.Random(SEED)
    slots = max(1, size // SMALL_READ_BYTES)
    return [rng.randrange(slots) * SMALL_READ_BYTES for _ in range(SMALL_READS)]


async def engine_small_reads(store: SegmentStore, offsets: list[int]) -> Latency:
    reader = store.open_reader(SEGMENT)
    latencies_s = []
    for offset in offsets:
        start_s = perf_counter()
        await reader.read(offset, SMALL_READ_BYTES)
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s)


def api_appends(url: str, segment: str, durability: str, count: int) -> AppendCase:
    """``count`` timed 1 KiB appends by ``TierClient.append`` (blocking, this thread)."""
    from tierfs.remote.client import TierClient

    record = b"a" * APPEND_BYTES
    client = TierClient(url)
    try:
        client.create(segment, durability=durability, parents=True)
        for _ in range(APPEND_WARMUP):
            client.append(segment, record)
        latencies_s = []
        start_all_s = perf_counter()
        for _ in range(count):
            start_s = perf_counter()
            client.append(segment, record)
            latencies_s.append(perf_counter() - start_s)
        elapsed_s = perf_counter() - start_all_s
    finally:
        client.close()
    label = f"API  {durability.upper()} TierClient.append"
    return AppendCase(label, "api", durability, Latency.of(latencies_s), count / elapsed_s)


async def engine_appends(store: SegmentStore, segment: str, durability: str, count: int) -> AppendCase:
    record = b"a" * APPEND_BYTES
    await store.create(segment, durability=durability, make_parents=True)
    for _ in range(APPEND_WARMUP):
        await store.append(segment, record)
    latencies_s = []
    start_all_s = perf_counter()
    for _ in range(count):
        start_s = perf_counter()
        await store.append(segment, record)
        latencies_s.append(perf_counter() - start_s)
    elapsed_s = perf_counter() - start_all_s
    label = f"engine {durability.upper()} await store.append"
    return AppendCase(label, "engine", durability, Latency.of(latencies_s), count / elapsed_s)


@dataclasses.dataclass(frozen=True)
class Options:
    size: int
    rounds: int
    appends: int
    write_size: int = 256 * MiB
    write_rounds: int = 3


async def measure_in_process(
    directory: Path, opts: Options, payload: bytes, daemon: Daemon, child: Child, log: TextIO
) -> Results:
    cache_bytes = warm_cache_bytes(opts.size)
    config = StoreConfig(data_dir=directory / "engine", block_cache_bytes=cache_bytes)
    async with open_store(config) as store:
        print("writing the same bytes in-process ...", file=log, flush=True)
        await write_in_process(store, payload)
        daemon_before = await trio.to_thread.run_sync(daemon.metrics)
        engine_misses_before = store.block_cache.misses
        rounds = []
        for index in range(opts.rounds):
            print(f"round {index + 1}/{opts.rounds}: (c), (a), (a'), (b), (b') ...", file=log, flush=True)
            rounds.append(await measure_round(store, child, daemon, directory, payload))
        offsets = small_read_offsets(opts.size)
        print("4 KiB reads ...", file=log, flush=True)
        small_api = Latency(**await trio.to_thread.run_sync(
            lambda: child.call("small_reads", offsets=offsets, length=SMALL_READ_BYTES)
        ))
        small_engine = await engine_small_reads(store, offsets)
        daemon_after = await trio.to_thread.run_sync(daemon.metrics)
        engine_misses = store.block_cache.misses - engine_misses_before
        print(f"appends: {opts.appends} x {APPEND_BYTES} B per case ...", file=log, flush=True)
        appends: dict[str, AppendCase] = {}
        for durability, segment in (("pd", PD_SEGMENT), ("vd", VD_SEGMENT)):
            appends[f"api_{durability}"] = await trio.to_thread.run_sync(
                api_appends, daemon.url, segment, durability, opts.appends
            )
            appends[f"engine_{durability}"] = await engine_appends(
                store, segment, durability, opts.appends
            )
        writes = None
        if opts.write_rounds:
            writes = await fsspec_writes.measure_writes(store, daemon, directory, opts.write_size,
                                                        opts.write_rounds, log)
    misses = "tierfs_cache_misses_total"
    return Results(
        size_bytes=opts.size,
        cache_bytes=cache_bytes,
        rounds=rounds,
        daemon_cache_misses_during_rounds=int(daemon_after[misses] - daemon_before[misses]),
        daemon_cache_bytes=int(daemon_after["tierfs_cache_bytes"]),
        engine_cache_misses_during_rounds=engine_misses,
        small_reads_api=small_api,
        small_reads_engine=small_engine,
        appends=appends,
        writes=writes,
    )


def run_all(directory: Path, opts: Options, log: TextIO) -> Results:
    payload = make_payload(opts.size, SEED)
    config_file = directory / "daemon.toml"
    config_file.write_text(f"block_cache_bytes = {warm_cache_bytes(opts.size)}\n")
    with contextlib.ExitStack() as stack:
        daemon = start_daemon(directory / "daemon", config_file=config_file, drop_tierfs_env=True,
                              log_path=directory / "daemon.log", verbose=False)
        daemon_stopped: list[int | None] = []

        def stop_daemon() -> None:
            """SIGTERM (the daemon flushes and closes its store); None if it had to be killed."""
            if not daemon_stopped:
                try:
                    daemon_stopped.append(daemon.stop(timeout_s=STOP_TIMEOUT_S)[0])
                except HarnessError:
                    daemon_stopped.append(None)

        stack.callback(stop_daemon)
        print(f"daemon serving {daemon.socket}; writing {opts.size // MiB} MiB through the API ...",
              file=log, flush=True)
        write_through_api(daemon, payload)
        child = Child(daemon.data_dir, SEGMENT, directory / "child.log")
        stack.callback(child.close)
        print("the fsspec child reads the segment once (sha256) ...", file=log, flush=True)
        check = child.call("hash", read_bytes=OPEN_READ_BYTES)
        if check["sha256"] != hashlib.sha256(payload).hexdigest() or check["nbytes"] != opts.size:
            raise RuntimeError("fsspec read other bytes than were appended")
        results = trio.run(measure_in_process, directory, opts, payload, daemon, child, log)
        child.close()
        stop_daemon()
        if daemon_stopped[0] != 0:
            print(f"the daemon exited with {daemon_stopped[0]}:\n{daemon.stderr_tail()}", file=log)
        if daemon.socket.exists():
            print("the daemon left its socket behind", file=log)
    return dataclasses.replace(results, daemon_exit_code=daemon_stopped[0])


# ---------------------------------------------------------------------- targets
def evaluate_targets(r: Results) -> list[Check]:
    return [
        Check("(a) / (r) fsspec.open vs pread + CRC", statistics.median(x.ceiling_ratio for x in r.rounds),
              TARGET_RATIO, True, "x"),
        *(fsspec_writes.write_checks(r.writes) if r.writes else []),
    ]


# ---------------------------------------------------------------------- report
ROWS: tuple[tuple[str, Callable[[Round], Throughput]], ...] = (
    (LABELS["a"], lambda x: x.fsspec_open.throughput),
    (LABELS["r"], lambda x: x.pread_ceiling.throughput),
    (LABELS["a'"], lambda x: x.engine_open.throughput),
    (LABELS["b"], lambda x: x.fsspec_cat.throughput),
    (LABELS["b'"], lambda x: x.engine_cat.throughput),
    (LABELS["d"], lambda x: x.fsspec_open_daemon.throughput),
    (f"(c) raw Unix socket, 2 processes, {SOCKET_PIECE_BYTES // MiB} MiB pieces",
     lambda x: x.socket_ceiling),
)


def format_reads(r: Results) -> list[str]:
    header = f"{'measurement':<50} {'MB/s':>9} {'min':>9} {'max':>9}"
    lines = [header, "-" * len(header)]
    for label, pick in ROWS:
        low, high = r.spread(pick)
        lines.append(f"{label:<50} {r.median(pick):>9,.1f} {low:>9,.1f} {high:>9,.1f}")
    return lines


def _cpu(scan: Scan) -> str:
    wall = scan.throughput.seconds
    return (f"wall {wall:.3f} s, CPU daemon {scan.daemon_cpu_s:.2f} + child "
            f"{scan.client_cpu_s:.2f} s")


def format_rounds(r: Results) -> list[str]:
    lines = []
    for index, x in enumerate(r.rounds, 1):
        lines.append(
            f"round {index}: (a) {x.fsspec_open.throughput.mb_per_s:,.1f} (r) "
            f"{x.pread_ceiling.throughput.mb_per_s:,.1f} -> {x.ceiling_ratio:.3f}; (a') "
            f"{x.engine_open.throughput.mb_per_s:,.1f} -> {x.open_ratio:.3f}; (b) "
            f"{x.fsspec_cat.throughput.mb_per_s:,.1f} (b') {x.engine_cat.throughput.mb_per_s:,.1f}"
            f" -> {x.cat_ratio:.3f}; (d) {x.fsspec_open_daemon.throughput.mb_per_s:,.1f} -> "
            f"{x.daemon_open_ratio:.3f}; (c) {x.socket_ceiling.mb_per_s:,.1f} MB/s"
        )
        lines.append(f"         (a) {_cpu(x.fsspec_open)}; (r) {_cpu(x.pread_ceiling)}; (b) {_cpu(x.fsspec_cat)}; "
                     f"(d) {_cpu(x.fsspec_open_daemon)}")
    return lines


def format_details(r: Results) -> list[str]:
    last = r.rounds[-1]
    fetched = {
        key: f"{(scan.fetched_direct_bytes or 0) / r.size_bytes:.3f} direct + "
             f"{(scan.fetched_daemon_bytes or 0) / r.size_bytes:.3f} daemon"
        for key, scan in (("a", last.fsspec_open), ("b", last.fsspec_cat), ("d", last.fsspec_open_daemon))
    }
    ms_per_request = {
        key: statistics.median(pick(x).seconds for x in r.rounds) * 1000 / (r.size_bytes / piece)
        for key, pick, piece in (
            ("a", lambda x: x.fsspec_open.throughput, OPEN_READ_BYTES),
            ("b", lambda x: x.fsspec_cat.throughput, CAT_RANGE_BYTES),
            ("r", lambda x: x.pread_ceiling.throughput, OPEN_READ_BYTES),
        )
    }
    ceiling_ratio = r.median(lambda x: x.socket_ceiling) / r.median(
        lambda x: x.engine_open.throughput
    )
    api, engine = r.small_reads_api, r.small_reads_engine
    return [
        f"block cache {r.cache_bytes / MiB:,.0f} MiB (daemon and engine); daemon cache holds "
        f"{r.daemon_cache_bytes / MiB:,.1f} MiB; misses during the rounds: daemon "
        f"{r.daemon_cache_misses_during_rounds}, engine {r.engine_cache_misses_during_rounds}",
        f"bytes fetched / segment size (last round): (a) {fetched['a']}, (b) {fetched['b']}, "
        f"(d) {fetched['d']}",
        f"time per fetch (median): (a) {ms_per_request['a']:.2f} ms per "
        f"{OPEN_READ_BYTES // MiB} MiB, (b) {ms_per_request['b']:.2f} ms per "
        f"{CAT_RANGE_BYTES // MiB} MiB call (one layout request each), (r) {ms_per_request['r']:.2f} ms "
        f"per {OPEN_READ_BYTES // MiB} MiB block",
        f"median (c) / (a'): {ceiling_ratio:.3f} (the socket ceiling against the engine); (a) / (a') "
        f"median of rounds {statistics.median(x.open_ratio for x in r.rounds):.3f} (issue 4's reference)",
        f"{SMALL_READ_BYTES} B reads at {api.samples:,} random offsets: fs.cat_file via daemon "
        f"p50 {api.p50_us:,.1f} us, p99 {api.p99_us:,.1f} us; engine reader.read p50 "
        f"{engine.p50_us:,.1f} us, p99 {engine.p99_us:,.1f} us",
        f"daemon stopped by SIGTERM: exit code {r.daemon_exit_code}",
    ]


def format_appends(r: Results) -> list[str]:
    header = f"{'append ' + str(APPEND_BYTES) + ' B, sequential':<36} {'p50 us':>9} {'p99 us':>9} {'max us':>9} {'appends/s':>10}"
    lines = [header, "-" * len(header)]
    for case in r.appends.values():
        lat = case.latency
        lines.append(
            f"{case.label:<36} {lat.p50_us:>9,.1f} {lat.p99_us:>9,.1f} {lat.max_us:>9,.1f} "
            f"{case.appends_per_s:>10,.0f}"
        )
    for durability in ("pd", "vd"):
        api, engine = r.appends[f"api_{durability}"].latency, r.appends[f"engine_{durability}"].latency
        lines.append(
            f"{durability.upper()} API / engine: p50 {api.p50_us / engine.p50_us:.2f} x "
            f"(+{api.p50_us - engine.p50_us:,.1f} us), p99 {api.p99_us / engine.p99_us:.2f} x "
            f"(+{api.p99_us - engine.p99_us:,.1f} us)"
        )
    return lines


def print_report(machine: dict[str, Any], r: Results, checks: list[Check], out: TextIO) -> None:
    fs = machine["filesystem"]
    print(
        f"fsspec benchmark: {r.size_bytes / MiB:g} MiB warm segment; daemon over its Unix "
        f"socket; {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']}",
        file=out,
    )
    print(
        f"reads: median of {len(r.rounds)} rounds; (a), (b) in a child process through "
        "fsspec, (a'), (b') in this process through the engine",
        file=out,
    )
    print(file=out)
    sections = [format_reads(r), format_rounds(r), format_details(r), format_appends(r),
                *([fsspec_writes.format_writes(r.writes)] if r.writes else []), format_checks(checks)]
    print_sections(sections, out)


def report_json(machine: dict[str, Any], r: Results, checks: list[Check]) -> dict[str, Any]:
    return {
        "benchmark": "fsspec",
        "open_read_bytes": OPEN_READ_BYTES,
        "cat_range_bytes": CAT_RANGE_BYTES,
        "append_bytes": APPEND_BYTES,
        "machine": machine,
        "medians_mb_per_s": {label: r.median(pick) for label, pick in ROWS},
        "round_ratios": [{"a_over_r": x.ceiling_ratio, "a_over_a_prime": x.open_ratio, "b_over_b_prime": x.cat_ratio,
                          "d_over_a_prime": x.daemon_open_ratio} for x in r.rounds],
        "results": dataclasses.asdict(r),
        "writes": fsspec_writes.writes_json(r.writes) if r.writes else None,
        "targets": checks_json(checks),
    }


# ------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mib", type=int, default=256, help="segment size in MiB (default 256)")
    parser.add_argument("--rounds", type=int, default=5, help="read rounds (default 5; medians)")
    parser.add_argument(
        "--appends", type=int, default=2000, help="timed 1 KiB appends per case (default 2000)"
    )
    parser.add_argument("--write-mib", type=int, default=256,
                        help="bytes written per write case, in MiB (default 256; 1024 for 1 GiB)")
    parser.add_argument("--write-rounds", type=int, default=3, help="write rounds (default 3; 0: none)")
    parser.add_argument("--writes-only", action="store_true",
                        help="only the write rounds (no reads, no 1 KiB appends)")
    add_scratch_arguments(parser, "daemon and engine data dirs")


def run(args: argparse.Namespace) -> int:
    if min(args.size_mib, args.rounds, args.appends, args.write_mib) < 1 or args.write_rounds < 0:
        print("--size-mib, --rounds, --appends and --write-mib must be >= 1, --write-rounds >= 0", file=sys.stderr)
        return EXIT_USAGE
    if args.writes_only:
        return run_in_scratch(
            "fsspec", args.dir, args.json,
            lambda directory: fsspec_writes.run_alone(directory, args.write_mib * MiB, max(1, args.write_rounds),
                                                      sys.stderr),
            fsspec_writes.write_checks, fsspec_writes.print_alone, fsspec_writes.alone_json,
            errors=(RuntimeError,),
        )
    opts = Options(args.size_mib * MiB, args.rounds, args.appends, args.write_mib * MiB, args.write_rounds)
    return run_in_scratch(
        "fsspec", args.dir, args.json,
        lambda directory: run_all(directory, opts, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(RuntimeError,),
    )

