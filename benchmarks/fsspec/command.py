"""fsspec benchmark: reads through ``tierfs://`` in another process next to their
ceilings, small reads and appends through the daemon next to the engine in-process, and
``tierfs://`` files written next to the engine appending the same bytes.

A daemon (block cache 1.25 x the segment) gets ``--size-mib`` (256) MiB through its API
(4 MiB PD appends), flushed and read once (cached); the same bytes go into a store in
this process. The fsspec side is a child process (``child.py``), which checks the hash
first. ``--rounds`` (5), each ratio the median of the rounds': (r) the ceiling of (a):
each chunk file's 1 MiB blocks ``pread`` and checked against the layout's CRC32C; (a)
``fsspec.open("tierfs://...", "rb")``, ``f.read(1 MiB)`` until EOF (flushed bytes from
the chunk files); (r) and (a) three times each, taking turns, the fastest counting; (c)
the ceiling of (d): a raw Unix-socket stream from this process to the child; (d) as (a)
with ``direct_reads=False``, every block through the daemon. Then 4 KiB ``fs.cat_file``
at 2,000 offsets next to the engine's reads, and 2,000 1 KiB appends (after 100 untimed)
by ``TierClient.append`` next to ``store.append``, PD and VD. Target (issue 4, 19): (a)
/ (r) >= 0.60.

Writes (issue 19 item 5; alone with ``--writes-only``), per round (``--write-rounds``,
3), ``--write-mib`` (256) MiB, PD, data dirs on one disk: (W) the ceiling, ``os.write``
of 8 MiB pieces each followed by ``fdatasync``; then in an order rotating from round to
round (e) ``store.append`` of 8 MiB pieces in this process; (wb) ``fs.open("tierfs://
<new>", "wb")``, ``f.write`` of 1 MiB pieces in a thread (each full 8 MiB buffer one
pipelined append to the daemon); (ab) the same in ``ab`` on a segment holding 4 KiB.
Each is timed from the create or open to the last acknowledgement, after both stores
flushed and ``sync`` (untimed), with what it was charged (``charges``); each fsspec
segment is read back and compared. Target: (wb) / (e) and (ab) / (e) >= 0.7.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import os
import random
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import procfs, stores
from benchmarks.harness.child import JsonLineChild
from benchmarks.harness.figures import Check, Latency, MiB, Throughput, make_payload, ratios
from benchmarks.harness.mounts import serving
from benchmarks.harness.scenario import Report, alternate, positive, rounds_table, say
from tierfs import SegmentInfo, StoreConfig, open_store
from tierfs.contracts import operations as ops
from tierfs.testing.harness import process_environment

HELP = "warm sequential reads via fsspec in another process and 1 KiB appends via the HTTP API vs the engine in-process"
SEGMENT = "bench/read"
PAIR_REPEATS, APPENDS, UNTIMED_APPENDS, SMALL_READS = 3, 2000, 100, 2000
USER_WRITE_BYTES = MiB  # one f.write
AB_HEAD_BYTES = 4096
WRITE_CASES = ("e", "wb", "ab")
WRITE_LABELS = {"W": "(W) ceiling: os.write 8 MiB + fdatasync, same disk",
                "e": "(e) engine in-process, await store.append(8 MiB)",
                "wb": "(wb) tierfs:// wb, f.write(1 MiB), 8 MiB appends",
                "ab": "(ab) tierfs:// ab, f.write(1 MiB), 8 MiB appends"}
LEGEND = {"(a)": "fsspec.open rb, f.read(1 MiB), direct", "(r)": "ceiling: pread + CRC32C of each 1 MiB block",
          "(d)": "as (a), direct_reads=False: all via daemon", "(c)": "raw Unix socket, 2 processes, 1 MiB pieces"}


def charges(directory: Path, daemon: Any) -> dict[str, float]:
    """What a case is charged with so far: the appending process's CPU (``daemon`` None:
    this one's), its event loop thread on a CPU and waiting for one, the writing thread's
    (``wb``, ``ab``), and the disk's busy time and bytes written (every tenant's)."""
    loop = procfs.thread_times(f"/proc/{daemon.pid}/task/{daemon.pid}/schedstat" if daemon else "/proc/self/schedstat")
    found = {"process CPU": procfs.cpu_s(daemon.pid) if daemon else procfs.self_cpu_s()}
    for what, times in (("loop", loop), ("writer", procfs.thread_times() if daemon else None)):
        if times:
            found |= {f"{what} on CPU": times[0], f"{what} waiting": times[1]}
    device = os.stat(directory).st_dev
    with suppress(OSError):
        fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text().split()
        found |= {"disk busy": int(fields[9]) / 1000, "disk MiB written": int(fields[6]) * 512 / MiB}
    return found


@dataclasses.dataclass(frozen=True)
class WriteCase:
    throughput: Throughput
    charged: dict[str, float]  # seconds, or MiB written

    @classmethod
    def of(cls, throughput: Throughput, before: dict[str, float], after: dict[str, float]) -> WriteCase:
        return cls(throughput, {key: after[key] - before[key] for key in before if key in after})


def disk_ceiling(directory: Path, payload: bytes, piece_bytes: int) -> Throughput:
    path = directory / "write-ceiling.bin"
    view = memoryview(payload)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start_s = perf_counter()
        for offset in range(0, len(view), piece_bytes):
            piece = view[offset:offset + piece_bytes]
            while piece:
                piece = piece[os.write(fd, piece):]
            os.fdatasync(fd)
        seconds = perf_counter() - start_s
    finally:
        os.close(fd)
        path.unlink()
    return Throughput(WRITE_LABELS["W"], len(payload), seconds)


async def engine_write(store: Any, directory: Path, name: str, payload: bytes, piece_bytes: int) -> WriteCase:
    view, before = memoryview(payload), charges(directory, None)
    start_s = perf_counter()
    await store.create(name, make_parents=True)
    for offset in range(0, len(view), piece_bytes):
        await store.append(name, view[offset:offset + piece_bytes])
    seconds, after = perf_counter() - start_s, charges(directory, None)
    info = await store.stat(name)
    if not isinstance(info, SegmentInfo) or info.durable_length != len(payload):
        raise RuntimeError(f"the engine holds {getattr(info, 'durable_length', None)} of {len(payload)} bytes")
    return WriteCase.of(Throughput(WRITE_LABELS["e"], len(payload), seconds), before, after)


def fsspec_write(fs: Any, daemon: Any, directory: Path, name: str, mode: str, payload: bytes) -> WriteCase:
    """(wb) or (ab) in this thread, then the segment read back and compared (untimed)."""
    head = bytes(range(256)) * (AB_HEAD_BYTES // 256) if mode == "ab" else b""
    if head:
        fs.pipe_file(name, head)
    view, before = memoryview(payload), charges(directory, daemon)
    start_s = perf_counter()
    with fs.open(name, mode) as f:
        for offset in range(0, len(view), USER_WRITE_BYTES):
            f.write(view[offset:offset + USER_WRITE_BYTES])
    seconds, after = perf_counter() - start_s, charges(directory, daemon)
    digest = hashlib.sha256()
    with fs.open(name, "rb") as f:
        while piece := f.read(4 * MiB):
            digest.update(piece)
    if digest.hexdigest() != hashlib.sha256(head + payload).hexdigest():
        raise RuntimeError(f"tierfs://{name} ({mode}) holds other bytes than were written")
    return WriteCase.of(Throughput(WRITE_LABELS[mode], len(payload), seconds), before, after)


async def measure_writes(daemon: Any, directory: Path, size: int, rounds: int) -> list[dict[str, Any]]:
    """The write rounds against ``daemon`` and a store opened here: per round (W) and the cases."""
    from tierfs.fsspec_impl.filesystem import WRITE_BUFFER_BYTES, TierFileSystem

    payload, found = make_payload(size, seed=19), []
    fs = TierFileSystem(url=daemon.url, skip_instance_cache=True)
    async with open_store(StoreConfig(data_dir=directory / "engine-writes")) as store:

        async def settle() -> None:
            await store.flush()
            await trio.to_thread.run_sync(lambda: fs.client.call(ops.FLUSH))
            await trio.to_thread.run_sync(os.sync)

        for index in range(rounds):
            order = WRITE_CASES[index % len(WRITE_CASES):] + WRITE_CASES[:index % len(WRITE_CASES)]
            say(f"write round {index + 1}/{rounds}: {size // MiB} MiB, (W) then {', '.join(order)} ...")
            await settle()
            found.append({"order": order, "W": await trio.to_thread.run_sync(
                disk_ceiling, directory, payload, WRITE_BUFFER_BYTES)})
            for case in order:
                await settle()
                name = f"bench/write-{case}-{index}"
                found[-1][case] = (await engine_write(store, directory, name, payload, WRITE_BUFFER_BYTES)
                                   if case == "e" else await trio.to_thread.run_sync(
                                       fsspec_write, fs, daemon, directory, name, case, payload))
            await store.delete(f"bench/write-e-{index}")
            for case in ("wb", "ab"):
                await trio.to_thread.run_sync(fs.rm_file, f"bench/write-{case}-{index}")
    fs.client.close()
    return found


def format_writes(rounds: list[dict[str, Any]], size: int) -> list[str]:
    columns = {"(W)": [r["W"] for r in rounds], **{f"({c})": [r[c].throughput for r in rounds] for c in WRITE_CASES}}
    lines = [f"write {size // MiB} MiB: " + "; ".join(WRITE_LABELS.values()),
             *rounds_table(columns, [("(wb)", "(e)"), ("(ab)", "(e)"), ("(e)", "(W)")]),
             "per round and case: wall s, and what it was charged (the appending process: the engine's or the daemon's)"]
    for index, r in enumerate(rounds, 1):
        lines += [f"round {index} ({', '.join(r['order'])}):"] + [
            f"  ({case}) {r[case].throughput.seconds:.2f} s; "
            + ", ".join(f"{key} {value:,.2f}" for key, value in r[case].charged.items()) for case in WRITE_CASES]
    return lines


def scan(child: JsonLineChild, daemon: Any, op: str, **args: Any) -> dict[str, Any]:
    """One of the child's scans, with the CPU the daemon spent meanwhile."""
    daemon_before = procfs.cpu_s(daemon.pid)
    return {**child.request({"op": op, **args}), "daemon_cpu_s": procfs.cpu_s(daemon.pid) - daemon_before}


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
    return {**figures, "daemon_cpu_s": 0.0}


def read_round(child: JsonLineChild, daemon: Any, directory: Path, payload: bytes) -> dict[str, dict[str, Any]]:
    found = {"(c)": socket_ceiling(child, directory, payload)}
    scans: dict[str, list[dict[str, Any]]] = {"(r)": [], "(a)": []}
    for index in range(PAIR_REPEATS):  # taking turns; the fastest of each counts
        for key in alternate(index, ["(r)", "(a)"]):
            scans[key].append(scan(child, daemon, "scan_pread") if key == "(r)" else
                              scan(child, daemon, "scan_open", read_bytes=MiB))
    found.update({key: min(values, key=lambda s: s["seconds"]) for key, values in scans.items()})
    found["(d)"] = scan(child, daemon, "scan_open", read_bytes=MiB, direct=False)
    return found


def timed_appends(append: Callable[[], object]) -> Latency:
    latencies_s = []
    for _ in range(UNTIMED_APPENDS + APPENDS):
        start_s = perf_counter()
        append()
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s[UNTIMED_APPENDS:])


async def engine_appends(store: Any, segment: str) -> Latency:
    latencies_s = []
    for _ in range(UNTIMED_APPENDS + APPENDS):
        start_s = perf_counter()
        await store.append(segment, b"a" * 1024)
        latencies_s.append(perf_counter() - start_s)
    return Latency.of(latencies_s[UNTIMED_APPENDS:])


async def measure_in_process(directory: Path, args: argparse.Namespace, payload: bytes, daemon: Any,
                             child: JsonLineChild) -> dict[str, Any]:
    config = StoreConfig(data_dir=directory / "engine", block_cache_bytes=stores.warm_cache_bytes(len(payload)))
    found: dict[str, Any] = {"rounds": [], "appends": {}}
    async with open_store(config) as store:
        say("writing the same bytes in-process ...")
        await stores.write_segment(store, SEGMENT, payload, 4 * MiB)
        await stores.sequential_scan(store, SEGMENT, len(payload), 4 * MiB, expected=payload)
        for index in range(args.rounds):
            say(f"round {index + 1}/{args.rounds}: (c), (r), (a), (d) ...")
            found["rounds"].append(await trio.to_thread.run_sync(read_round, child, daemon, directory, payload))
        rng = random.Random(4)
        offsets = [rng.randrange(len(payload) // 4096) * 4096 for _ in range(SMALL_READS)]
        found["small_api"] = Latency(**child.request({"op": "small_reads", "offsets": offsets, "length": 4096}))
        found["small_engine"] = await stores.random_reads(store, SEGMENT, len(payload), SMALL_READS, seed=4)
        say(f"appends: {APPENDS} x 1 KiB per case ...")
        for durability in ("pd", "vd"):
            segment, client = f"bench/append-{durability}", daemon.client()
            client.create(segment, durability=durability, parents=True)
            found["appends"][f"API {durability.upper()} TierClient.append"] = await trio.to_thread.run_sync(
                timed_appends, functools.partial(client.append, segment, b"a" * 1024))
            client.close()
            await store.create(segment, durability=durability, make_parents=True)
            found["appends"][f"engine {durability.upper()} await store.append"] = await engine_appends(store, segment)
    return found


def measure(directory: Path, args: argparse.Namespace) -> Report:
    size = args.size_mib * MiB
    with serving(directory / "daemon", f"block_cache_bytes = {stores.warm_cache_bytes(size)}\n") as daemon:
        found = {} if args.writes_only else reads_and_appends(directory, args, daemon)
        found["writes"] = trio.run(measure_writes, daemon, directory, args.write_mib * MiB,
                                   args.write_rounds)
    return report(found, args)


def reads_and_appends(directory: Path, args: argparse.Namespace, daemon: Any) -> dict[str, Any]:
    size = args.size_mib * MiB
    payload = make_payload(size, 4)
    say(f"daemon serving {daemon.socket}; writing {args.size_mib} MiB through the API ...")
    client = daemon.client()
    stores.write_via_client(client, SEGMENT, payload)
    for offset in range(0, size, 4 * MiB):  # fills the daemon's block cache
        if client.read(SEGMENT, offset, min(size, offset + 4 * MiB)) != payload[offset:offset + 4 * MiB]:
            raise RuntimeError(f"the daemon returned other bytes at {offset}")
    client.close()
    env = process_environment({"TIERFS_DATA_DIR": str(daemon.data_dir)}, drop_tierfs=True)
    with JsonLineChild("benchmarks.fsspec.child", SEGMENT, log_path=directory / "child.log", env=env) as child:
        child.answer()  # ready
        check = child.request({"op": "hash", "read_bytes": MiB})
        if check["sha256"] != hashlib.sha256(payload).hexdigest() or check["nbytes"] != size:
            raise RuntimeError("fsspec read other bytes than were appended")
        return trio.run(measure_in_process, directory, args, payload, daemon, child)


def report(found: dict[str, Any], args: argparse.Namespace) -> Report:
    sections = [format_writes(found["writes"], args.write_mib * MiB)]
    writes = found["writes"]
    checks = [Check.over(f"({case}) / (e) tierfs:// {case} vs engine",
                         ratios([r[case].throughput for r in writes], [r["e"].throughput for r in writes]), 0.7, True)
              for case in ("wb", "ab")]
    if "rounds" not in found:
        return Report(f"fsspec writes: {args.write_mib} MiB per case, 8 MiB appends, PD", sections, checks, found)
    rounds = found["rounds"]
    columns = {key: [Throughput(key, r[key]["nbytes"], r[key]["seconds"]) for r in rounds] for key in LEGEND}
    per_round = [f"round {index}: wall / CPU daemon + child, s: " + "; ".join(
        f"{key} {r[key]['seconds']:.3f} / {r[key]['daemon_cpu_s']:.2f} + {r[key]['cpu_s']:.2f}" for key in LEGEND)
        for index, r in enumerate(rounds, 1)]
    api, engine = found["small_api"], found["small_engine"]
    per_round.append(f"4 KiB reads at {api.samples:,} random offsets: fs.cat_file via daemon {api.text()}; engine "
                     f"{engine.text()}")
    appends = list(found["appends"].items())
    lines = [f"append 1 KiB, {label}: {lat.text()}" for label, lat in appends]
    lines += [f"{d} API / engine: p50 {a.p50_us / e.p50_us:.2f} x (+{a.p50_us - e.p50_us:,.1f} us), p99 "
              f"{a.p99_us / e.p99_us:.2f} x" for d, (_, a), (_, e) in (("PD", *appends[:2]), ("VD", *appends[2:]))]
    sections[:0] = [[f"{key} {label}" for key, label in LEGEND.items()],
                    rounds_table(columns, [("(a)", "(r)"), ("(d)", "(c)")]), per_round, lines]
    checks.insert(0, Check.over("(a) / (r) fsspec.open vs pread + CRC", ratios(columns["(a)"], columns["(r)"]), 0.60,
                                True))
    title = (f"fsspec benchmark: {args.size_mib} MiB warm segment; daemon over its Unix socket; (a), (r), (d) in a "
             "child process through fsspec")
    return Report(title, sections, checks, found)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mib", type=positive, default=256, help="segment size in MiB (default 256)")
    parser.add_argument("--rounds", type=positive, default=5, help="read rounds (default 5; medians)")
    parser.add_argument("--write-mib", type=positive, default=256, help="bytes written per write case, MiB (default 256)")
    parser.add_argument("--write-rounds", type=positive, default=3, help="write rounds (default 3)")
    parser.add_argument("--writes-only", action="store_true", help="only the write rounds (no reads, no 1 KiB appends)")
