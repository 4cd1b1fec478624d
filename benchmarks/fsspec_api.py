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
import random
import socket
import sys
import threading
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio

from benchmarks import fsspec_writes
from benchmarks.common import (
    EXIT_USAGE,
    Latency,
    MiB,
    Throughput,
    add_scratch_arguments,
    make_payload,
    run_in_scratch,
    warm_cache_bytes,
)
from benchmarks.fsspec_child import Child
from benchmarks.fsspec_report import (
    APPEND_BYTES,
    CAT_RANGE_BYTES,
    LABELS,
    OPEN_READ_BYTES,
    SMALL_READ_BYTES,
    SOCKET_PIECE_BYTES,
    AppendCase,
    Results,
    Round,
    Scan,
    evaluate_targets,
    print_report,
    report_json,
)
from benchmarks.fsspec_writes import process_cpu_s
from tierfs import StoreConfig, open_store
from tierfs.contracts.info import SegmentInfo
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import Daemon, HarnessError, start_daemon

HELP = "warm sequential reads via fsspec in another process and 1 KiB appends via the HTTP API vs the engine in-process"

SEGMENT = "bench/read"
PD_SEGMENT = "bench/append-pd"
VD_SEGMENT = "bench/append-vd"
WRITE_PIECE_BYTES = 4 * MiB  # appends that build the segment; also the warm-up reads
SMALL_READS = 2000
APPEND_WARMUP = 100
PAIR_REPEATS = 3  # (r) and (a) per round, best of each (see best_of_pairs)
SEED = 4
STOP_TIMEOUT_S = 60.0  # the daemon flushes before it exits


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
        if args.write_rounds < 1:
            print("--writes-only needs --write-rounds >= 1", file=sys.stderr)
            return EXIT_USAGE
        return run_in_scratch(
            "fsspec", args.dir, args.json,
            lambda directory: fsspec_writes.run_alone(directory, args.write_mib * MiB, args.write_rounds, sys.stderr),
            fsspec_writes.write_checks, fsspec_writes.print_alone, fsspec_writes.alone_json,
            errors=(RuntimeError,),
        )
    opts = Options(args.size_mib * MiB, args.rounds, args.appends, args.write_mib * MiB, args.write_rounds)
    return run_in_scratch(
        "fsspec", args.dir, args.json,
        lambda directory: run_all(directory, opts, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(RuntimeError,),
    )

