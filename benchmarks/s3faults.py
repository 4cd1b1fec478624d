"""S3 faults benchmark: cold reads through a fault-injecting proxy, fault-free next to
503 SlowDown + resets mid-body + stalls, in one run; and every acknowledged byte read
back.

One run starts its own S3-protocol server, s3rver (npm, see ``benchmarks/s3server.py``),
on 127.0.0.1 with its data in the scratch directory ``tmp-tierfs-bench-*`` under
``--dir``, and three fault proxies in front of it (``tierfs.testing.fault_proxy``, each
its own process, so a proxy never competes with the store for the GIL):

- *write*: faults on every request (``--slowdown``, ``--reset``, ``--stall`` rates, a stall
  lasting ``--stall-s`` seconds);
- *clean*: no faults;
- *faulty*: the same faults as *write*.

Set-up through *write* (the store's tier-2 is ``s3://tierfs-bench/chunks``; default
configuration): a segment of ``--size-mib`` MiB (default 128) by 1 MiB VD appends, then
``await store.flush()``. Bytes acknowledged = the sum of the appends that returned. The
store is closed.

Then an outage (``--outage-s``, default 10 s; 0 skips it): the *write* proxy resets
every connection for that long (SIGUSR1) while the store appends the first 64 MiB of
the payload to a second segment by 1 MiB VD appends; reported: the bytes acknowledged
and how long the appends took, the bytes in tier-2 when the outage ends, and how long
after its end tier-2 held them all (the storage writer retries on its own). That
segment is read back once, cold, through *clean*, and compared.

Each of ``--rounds`` rounds (default 2; the order of (a) and (b) alternates):

- (a) a cold sequential read through *clean*: a fresh ``open_store`` (empty block cache,
  default configuration, so ``tier2_read_timeout_s`` = 1 s per MiB),
  ``reader.read(offset, 1 MiB)`` from 0 to the end, wall time, each piece compared with
  the payload;
- (b) the same through *faulty*.

``--read-timeout-s`` sets the stores' ``tier2_read_timeout_s``: a value far above
``--stall-s`` (e.g. 60) shows what the stalls cost without the deadline and the hedge.

Reported: both throughputs, the median of the rounds' (b)/(a) ratios (target >= 0.5:
faults may halve a cold read, not more), bytes acknowledged, bytes read back equal to
them and bytes read back different (targets: all, and 0), and the proxies' counters
(requests, 503s, resets, stalls). A missed target is reported, not an error: the exit
code is 0 either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

from benchmarks.common import (
    Check,
    MiB,
    Throughput,
    add_size_rounds_arguments,
    checks_json,
    format_checks,
    make_payload,
    print_sections,
    run_size_rounds,
)

HELP = "cold S3 reads through 503s, resets and stalls vs fault-free; bytes acked vs read back"
BUCKET = "tierfs-bench"
SEGMENT = "bench/faults"
OUTAGE_SEGMENT = "bench/outage"
PROXY_START_TIMEOUT_S = 30.0
OUTAGE_MAX_BYTES = 64 * MiB  # appended during the outage (well below max_backlog_bytes)


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    slowdown_rate: float
    reset_rate: float
    stall_rate: float
    stall_s: float

    def arguments(self) -> list[str]:
        return ["--slowdown", str(self.slowdown_rate), "--reset", str(self.reset_rate),
                "--stall", str(self.stall_rate), "--stall-s", str(self.stall_s)]


@dataclasses.dataclass(frozen=True)
class Round:
    clean: Throughput
    faulty: Throughput

    @property
    def ratio(self) -> float:
        return self.faulty.mb_per_s / self.clean.mb_per_s


@dataclasses.dataclass(frozen=True)
class Outage:
    seconds: float
    acked_bytes: int
    append_s: float  # time to append them all, S3 unreachable
    flushed_during_bytes: int  # in tier-2 when the outage ended
    caught_up_s: float  # from the end of the outage until tier-2 held every byte


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    faults: FaultSettings
    read_timeout_s: float
    acked_bytes: int
    flush_s: float
    rounds: list[Round]
    read_back_equal_bytes: int  # per cold read, the least over all reads
    read_back_different_bytes: int  # summed over all reads
    counters: dict[str, dict[str, int]]
    outage: Outage | None
    outage_read_back_equal_bytes: int

    @property
    def median_ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)


@dataclasses.dataclass(frozen=True)
class ProxyProcess:
    url: str
    process: subprocess.Popen[str]

    def start_outage(self) -> None:
        """S3 unreachable through this proxy for its ``--outage-s`` from now."""
        self.process.send_signal(signal.SIGUSR1)


@contextmanager
def fault_proxy(upstream: str, faults: FaultSettings | None, seed: int, counters: dict[str, int],
                log_path: Path, outage_s: float = 0.0) -> Iterator[ProxyProcess]:
    """``python -m tierfs.testing.fault_proxy`` in its own process; fills ``counters``
    when it stops."""
    command = [sys.executable, "-m", "tierfs.testing.fault_proxy", upstream, "--seed", str(seed),
               "--outage-s", str(outage_s)]
    command += faults.arguments() if faults else []
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the fault proxy did not start: {log_path.read_text(errors='replace')[-2000:]}")
        yield ProxyProcess("http://" + line.split()[-1], process)
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=PROXY_START_TIMEOUT_S)
        if out.strip():
            counters.update(json.loads(out.strip().splitlines()[-1]))


async def _write(config: Any, payload: bytes) -> tuple[int, float]:
    from tierfs import open_store

    acked = 0
    async with open_store(config) as store:
        await store.create(SEGMENT, durability="vd", make_parents=True)
        for start in range(0, len(payload), MiB):
            piece = payload[start : start + MiB]
            await store.append(SEGMENT, piece)
            acked += len(piece)
        started = perf_counter()
        await store.flush()
        return acked, perf_counter() - started


async def _outage(config: Any, payload: bytes, proxy: ProxyProcess, outage_s: float) -> Outage:
    """Appends through an outage, then the time until tier-2 holds them all."""
    import trio

    from tierfs import open_store

    acked = 0
    async with open_store(config) as store:
        await store.create(OUTAGE_SEGMENT, durability="vd", make_parents=True)
        proxy.start_outage()
        started = perf_counter()
        for start in range(0, len(payload), MiB):
            piece = payload[start : start + MiB]
            await store.append(OUTAGE_SEGMENT, piece)
            acked += len(piece)
        appended_s = perf_counter() - started
        await trio.sleep(max(0.0, outage_s - appended_s))
        seg = store.table.segment(OUTAGE_SEGMENT)
        flushed_during = seg.flushed_length
        ended = perf_counter()
        while seg.flushed_length < acked:
            await trio.sleep(0.05)
        return Outage(outage_s, acked, appended_s, flushed_during, perf_counter() - ended)


async def _cold_read(config: Any, payload: bytes, segment: str = SEGMENT) -> tuple[float, int, int]:
    """Seconds, bytes equal to the payload, bytes different (a missing tail counts as
    not equal)."""
    from tierfs import open_store

    equal = different = 0
    async with open_store(config) as store:
        reader = store.open_reader(segment)
        started = perf_counter()
        for offset in range(0, len(payload), MiB):
            data = await reader.read(offset, MiB)
            expected = payload[offset : offset + MiB]
            if data == expected:
                equal += len(data)
            else:
                same = sum(a == b for a, b in zip(data, expected, strict=False))
                equal, different = equal + same, different + len(data) - same
        return perf_counter() - started, equal, different


def run_all(directory: Path, size: int, rounds: int, faults: FaultSettings, outage_s: float,
            settings: dict[str, Any], log: TextIO) -> Results:
    import trio

    from benchmarks.s3server import s3_server
    from tierfs import StoreConfig

    payload = make_payload(size, seed=15)
    counters: dict[str, dict[str, int]] = {"write": {}, "clean": {}, "faulty": {}}
    with s3_server(directory / "s3rver", log) as endpoint:
        endpoint.create_bucket(BUCKET)
        base = StoreConfig(data_dir=directory / "data", tier2_url=f"s3://{BUCKET}/chunks", **settings)

        def through(proxy_url: str) -> StoreConfig:
            return base.replace(tier2_options={**endpoint.storage_options(), "endpoint_url": proxy_url})

        outage_payload = payload[: min(len(payload), OUTAGE_MAX_BYTES)]
        outage: Outage | None = None
        with fault_proxy(endpoint.url, faults, 1, counters["write"], directory / "proxy-write.log",
                         outage_s) as writer:
            acked, flush_s = trio.run(_write, through(writer.url), payload)
            print(f"written: {acked} bytes acknowledged, flushed in {flush_s:.1f} s", file=log, flush=True)
            if outage_s > 0:
                outage = trio.run(_outage, through(writer.url), outage_payload, writer, outage_s)
                print(f"outage of {outage_s:g} s: {outage.acked_bytes} bytes acknowledged in "
                      f"{outage.append_s:.1f} s, tier-2 caught up {outage.caught_up_s:.1f} s after it",
                      file=log, flush=True)
        measured: list[Round] = []
        least_equal, different = acked, 0
        with (
            fault_proxy(endpoint.url, None, 2, counters["clean"], directory / "proxy-clean.log") as clean,
            fault_proxy(endpoint.url, faults, 3, counters["faulty"], directory / "proxy-faulty.log") as faulty,
        ):
            clean_url, faulty_url = clean.url, faulty.url
            outage_equal = 0
            if outage is not None:
                _, outage_equal, wrong = trio.run(_cold_read, through(clean_url), outage_payload, OUTAGE_SEGMENT)
                different += wrong
            for index in range(rounds):
                order = [("clean", clean_url), ("faulty", faulty_url)]
                seconds: dict[str, float] = {}
                for kind, url in order if index % 2 == 0 else order[::-1]:
                    seconds[kind], equal, wrong = trio.run(_cold_read, through(url), payload)
                    least_equal, different = min(least_equal, equal), different + wrong
                measured.append(Round(Throughput.of("cold read, fault-free", size, seconds["clean"]),
                                      Throughput.of("cold read, faults", size, seconds["faulty"])))
                print(f"round {index + 1}/{rounds}: fault-free {measured[-1].clean.mb_per_s:.0f} MB/s, "
                      f"faults {measured[-1].faulty.mb_per_s:.0f} MB/s", file=log, flush=True)
    return Results(size, faults, base.tier2_read_timeout_s, acked, flush_s, measured, least_equal, different,
                   counters, outage, outage_equal)


def evaluate_targets(results: Results) -> list[Check]:
    checks = [
        Check("(b)/(a) cold read, faults vs none", results.median_ratio, 0.5, True, "x"),
        Check("bytes read back / acknowledged", results.read_back_equal_bytes / results.acked_bytes, 1.0, True, ""),
        Check("bytes read back different", float(results.read_back_different_bytes), 0.0, False, ""),
    ]
    if results.outage is not None:
        checks.append(Check("outage: read back / acknowledged",
                            results.outage_read_back_equal_bytes / results.outage.acked_bytes, 1.0, True, ""))
    return checks


def print_report(machine: dict[str, Any], results: Results, checks: list[Check], out: TextIO) -> None:
    f = results.faults
    header = [
        f"s3faults benchmark: {results.size_bytes // MiB} MiB segment on s3rver (127.0.0.1) behind "
        f"fault proxies; faults: {f.slowdown_rate:.0%} 503 SlowDown, {f.reset_rate:.0%} resets "
        f"mid-body, {f.stall_rate:.0%} stalls of {f.stall_s:g} s; tier2_read_timeout_s "
        f"{results.read_timeout_s:g}",
        f"machine: {machine}",
        f"acknowledged {results.acked_bytes} bytes; flush through faults {results.flush_s:.1f} s",
    ]
    rows = [f"{'round':<6} {'(a) fault-free MB/s':>20} {'(b) faults MB/s':>16} {'(b)/(a)':>8}"]
    for i, r in enumerate(results.rounds, start=1):
        rows.append(f"{i:<6} {r.clean.mb_per_s:20.1f} {r.faulty.mb_per_s:16.1f} {r.ratio:8.3f}")
    proxies = [f"proxy {name:<7} {json.dumps(c)}" for name, c in results.counters.items()]
    outage = []
    if (o := results.outage) is not None:
        outage = [f"outage {o.seconds:g} s: {o.acked_bytes} bytes acknowledged in {o.append_s:.2f} s, "
                  f"{o.flushed_during_bytes} in tier-2 at its end, all {o.caught_up_s:.1f} s after it"]
    print_sections([header, rows, outage, proxies, format_checks(checks)], out)


def report_json(machine: dict[str, Any], results: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "results": dataclasses.asdict(results),
            "median_ratio": results.median_ratio, "targets": checks_json(checks)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 128, 2, "store, S3 server data")
    parser.add_argument("--slowdown", type=float, default=0.10, help="rate of 503 SlowDown (default 0.10)")
    parser.add_argument("--reset", type=float, default=0.02, help="rate of resets mid-body (default 0.02)")
    parser.add_argument("--stall", type=float, default=0.02, help="rate of stalls mid-body (default 0.02)")
    parser.add_argument("--stall-s", type=float, default=10.0, help="length of a stall in s (default 10)")
    parser.add_argument("--outage-s", type=float, default=10.0,
                        help="length of the outage phase in s (default 10; 0: none)")
    parser.add_argument("--read-timeout-s", type=float, default=None,
                        help="the stores' tier2_read_timeout_s (default: the default, 1 s per MiB); "
                        "a large value shows what stalls cost without deadlines and hedging")


def run(args: argparse.Namespace) -> int:
    from benchmarks.s3server import S3ServerError

    faults = FaultSettings(args.slowdown, args.reset, args.stall, args.stall_s)
    settings = {} if args.read_timeout_s is None else {"tier2_read_timeout_s": args.read_timeout_s}
    return run_size_rounds(
        "s3faults", args,
        lambda directory, size, rounds: run_all(directory, size, rounds, faults, args.outage_s, settings,
                                                sys.stderr),
        evaluate_targets, print_report, report_json, errors=(S3ServerError, RuntimeError),
    )
