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
PROXY_START_TIMEOUT_S = 30.0


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

    @property
    def median_ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)


@contextmanager
def fault_proxy(upstream: str, faults: FaultSettings | None, seed: int, counters: dict[str, int],
                log_path: Path) -> Iterator[str]:
    """``python -m tierfs.testing.fault_proxy`` in its own process; yields its URL and
    fills ``counters`` when it stops."""
    command = [sys.executable, "-m", "tierfs.testing.fault_proxy", upstream, "--seed", str(seed)]
    command += faults.arguments() if faults else []
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the fault proxy did not start: {log_path.read_text(errors='replace')[-2000:]}")
        yield "http://" + line.split()[-1]
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


async def _cold_read(config: Any, payload: bytes) -> tuple[float, int, int]:
    """Seconds, bytes equal to the payload, bytes different (a missing tail counts as
    not equal)."""
    from tierfs import open_store

    equal = different = 0
    async with open_store(config) as store:
        reader = store.open_reader(SEGMENT)
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


def run_all(directory: Path, size: int, rounds: int, faults: FaultSettings, settings: dict[str, Any],
            log: TextIO) -> Results:
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

        with fault_proxy(endpoint.url, faults, 1, counters["write"], directory / "proxy-write.log") as url:
            acked, flush_s = trio.run(_write, through(url), payload)
        print(f"written: {acked} bytes acknowledged, flushed in {flush_s:.1f} s", file=log, flush=True)
        measured: list[Round] = []
        least_equal, different = acked, 0
        with (
            fault_proxy(endpoint.url, None, 2, counters["clean"], directory / "proxy-clean.log") as clean_url,
            fault_proxy(endpoint.url, faults, 3, counters["faulty"], directory / "proxy-faulty.log") as faulty_url,
        ):
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
                   counters)


def evaluate_targets(results: Results) -> list[Check]:
    return [
        Check("(b)/(a) cold read, faults vs none", results.median_ratio, 0.5, True, "x"),
        Check("bytes read back / acknowledged", results.read_back_equal_bytes / results.acked_bytes, 1.0, True, ""),
        Check("bytes read back different", float(results.read_back_different_bytes), 0.0, False, ""),
    ]


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
    print_sections([header, rows, proxies, format_checks(checks)], out)


def report_json(machine: dict[str, Any], results: Results, checks: list[Check]) -> dict[str, Any]:
    return {"machine": machine, "results": dataclasses.asdict(results),
            "median_ratio": results.median_ratio, "targets": checks_json(checks)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 128, 2, "store, S3 server data")
    parser.add_argument("--slowdown", type=float, default=0.10, help="rate of 503 SlowDown (default 0.10)")
    parser.add_argument("--reset", type=float, default=0.02, help="rate of resets mid-body (default 0.02)")
    parser.add_argument("--stall", type=float, default=0.02, help="rate of stalls mid-body (default 0.02)")
    parser.add_argument("--stall-s", type=float, default=10.0, help="length of a stall in s (default 10)")
    parser.add_argument("--read-timeout-s", type=float, default=None,
                        help="the stores' tier2_read_timeout_s (default: the default, 1 s per MiB); "
                        "a large value shows what stalls cost without deadlines and hedging")


def run(args: argparse.Namespace) -> int:
    from benchmarks.s3server import S3ServerError

    faults = FaultSettings(args.slowdown, args.reset, args.stall, args.stall_s)
    settings = {} if args.read_timeout_s is None else {"tier2_read_timeout_s": args.read_timeout_s}
    return run_size_rounds(
        "s3faults", args,
        lambda directory, size, rounds: run_all(directory, size, rounds, faults, settings, sys.stderr),
        evaluate_targets, print_report, report_json, errors=(S3ServerError, RuntimeError),
    )
