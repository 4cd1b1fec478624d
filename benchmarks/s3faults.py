"""S3 faults benchmark: cold reads through a fault-injecting proxy next to fault-free ones,
and every acknowledged byte read back.

s3rver and three fault proxies (``tierfs.testing.fault_proxy``, each a process): *write*
and *faulty* inject ``--slowdown`` 503s, ``--reset`` resets mid-body and ``--stall``
stalls of ``--stall-s``; *clean* none. Through *write*: a segment of ``--size-mib`` (128)
MiB by 1 MiB VD appends, flushed; then an outage of ``--outage-s`` (10; 0 skips it),
*write* resetting every connection while up to 64 MiB more are appended: how long the
appends took and how long after the outage tier-2 held them all (that segment is read
back through *clean*). Then ``--rounds`` (2), the order alternating: (a) a cold
sequential read through *clean* (a fresh store, default configuration or
``--read-timeout-s``), each piece compared; (b) the same through *faulty*.
Targets: (b)/(a) >= 0.5, every acknowledged byte read back equal, none different.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from benchmarks.harness import s3
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, ratios
from benchmarks.harness.scenario import (
    Report,
    add_size_rounds_arguments,
    at_least_one,
    run_scenario,
    table,
)

HELP = "cold S3 reads through 503s, resets and stalls vs fault-free; bytes acked vs read back"
SEGMENT, OUTAGE_SEGMENT = "bench/faults", "bench/outage"
OUTAGE_MAX_BYTES = 64 * MiB  # well below max_backlog_bytes


@contextmanager
def fault_proxy(upstream: str, faults: list[str], seed: int, counters: dict[str, int], log_path: Path,
                outage_s: float = 0.0) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``python -m tierfs.testing.fault_proxy`` in its own process: (its URL, the process);
    fills ``counters`` when it stops."""
    command = [sys.executable, "-m", "tierfs.testing.fault_proxy", upstream, "--seed", str(seed), "--outage-s",
               str(outage_s), *faults]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the fault proxy did not start: {log_path.read_text(errors='replace')[-2000:]}")
        yield "http://" + line.split()[-1], process
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
        if out.strip():
            counters.update(json.loads(out.strip().splitlines()[-1]))


async def append_all(config: Any, name: str, payload: bytes, outage: tuple[subprocess.Popen[str], float] | None = None
                     ) -> dict[str, float]:
    """VD appends of 1 MiB; without ``outage`` a flush after them (timed), with it the
    outage is started first and the time until tier-2 holds every byte is measured."""
    from tierfs import open_store

    acked = 0
    async with open_store(config) as store:
        await store.create(name, durability="vd", make_parents=True)
        if outage is not None:
            outage[0].send_signal(signal.SIGUSR1)  # S3 unreachable through the proxy for its --outage-s
        started = perf_counter()
        for start in range(0, len(payload), MiB):
            await store.append(name, payload[start : start + MiB])
            acked += min(MiB, len(payload) - start)
        appended_s = perf_counter() - started
        if outage is None:
            await store.flush()
            return {"acked_bytes": acked, "flush_s": perf_counter() - started - appended_s}
        await trio.sleep(max(0.0, outage[1] - appended_s))
        seg, ended = store.table.segment(name), perf_counter()
        flushed_during = seg.flushed_length
        while seg.flushed_length < acked:
            await trio.sleep(0.05)
        return {"acked_bytes": acked, "append_s": appended_s, "flushed_during_bytes": flushed_during,
                "caught_up_s": perf_counter() - ended}


async def cold_read(config: Any, payload: bytes, name: str = SEGMENT) -> tuple[float, int, int]:
    """Seconds, bytes equal to the payload, bytes different (a missing tail is not equal)."""
    from tierfs import open_store

    equal = different = 0
    async with open_store(config) as store:
        reader, started = store.open_reader(name), perf_counter()
        for offset in range(0, len(payload), MiB):
            data, expected = await reader.read(offset, MiB), payload[offset : offset + MiB]
            same = len(data) if data == expected else sum(a == b for a, b in zip(data, expected, strict=False))
            equal, different = equal + same, different + len(data) - same
        return perf_counter() - started, equal, different


def measure(directory: Path, args: argparse.Namespace) -> Report:
    from tierfs import StoreConfig

    at_least_one(args, "size_mib", "rounds")
    size, log = args.size_mib * MiB, sys.stderr
    faults = ["--slowdown", str(args.slowdown), "--reset", str(args.reset), "--stall", str(args.stall),
              "--stall-s", str(args.stall_s)]
    payload = make_payload(size, seed=15)
    counters: dict[str, dict[str, int]] = {"write": {}, "clean": {}, "faulty": {}}
    settings = {} if args.read_timeout_s is None else {"tier2_read_timeout_s": args.read_timeout_s}
    with s3.s3_server(directory / "s3rver", log) as endpoint:
        base = StoreConfig(data_dir=directory / "data", tier2_url=f"s3://{s3.BUCKET}/chunks", **settings)

        def through(proxy_url: str) -> StoreConfig:
            return base.replace(tier2_options=endpoint.storage_options(proxy_url))

        outage_payload, outage = payload[:OUTAGE_MAX_BYTES], None
        with fault_proxy(endpoint.url, faults, 1, counters["write"], directory / "proxy-write.log",
                         args.outage_s) as (url, process):
            written = trio.run(append_all, through(url), SEGMENT, payload)
            print(f"written: {written['acked_bytes']:.0f} bytes acknowledged, flushed in {written['flush_s']:.1f} s",
                  file=log, flush=True)
            if args.outage_s > 0:
                outage = trio.run(append_all, through(url), OUTAGE_SEGMENT, outage_payload, (process, args.outage_s))
        reads: dict[str, list[Throughput]] = {"clean": [], "faulty": []}
        least_equal, different, outage_equal = int(written["acked_bytes"]), 0, 0
        with fault_proxy(endpoint.url, [], 2, counters["clean"], directory / "proxy-clean.log") as (clean, _), \
                fault_proxy(endpoint.url, faults, 3, counters["faulty"], directory / "proxy-faulty.log") as (faulty, _):
            if outage is not None:
                _, outage_equal, wrong = trio.run(cold_read, through(clean), outage_payload, OUTAGE_SEGMENT)
                different += wrong
            for index in range(args.rounds):
                order = [("clean", clean), ("faulty", faulty)]
                for kind, url in order if index % 2 == 0 else order[::-1]:
                    seconds, equal, wrong = trio.run(cold_read, through(url), payload)
                    least_equal, different = min(least_equal, equal), different + wrong
                    reads[kind].append(Throughput(f"cold read, {kind}", size, seconds))
                print(f"round {index + 1}/{args.rounds}: fault-free {reads['clean'][-1].mb_per_s:.0f} MB/s, faults "
                      f"{reads['faulty'][-1].mb_per_s:.0f} MB/s", file=log, flush=True)
    checks = [Check.over("(b)/(a) cold read, faults vs none", ratios(reads["faulty"], reads["clean"]), 0.5, True),
              Check("bytes read back / acknowledged", least_equal / written["acked_bytes"], 1.0, True),
              Check("bytes read back different", float(different), 0.0, False)]
    lines = [f"acknowledged {written['acked_bytes']:.0f} bytes; flush through faults {written['flush_s']:.1f} s"]
    if outage is not None:
        checks.append(Check("outage: read back / acknowledged", outage_equal / outage["acked_bytes"], 1.0, True))
        lines.append(f"outage {args.outage_s:g} s: {outage['acked_bytes']:.0f} bytes acknowledged in "
                     f"{outage['append_s']:.2f} s, {outage['flushed_during_bytes']:.0f} in tier-2 at its end, all "
                     f"{outage['caught_up_s']:.1f} s after it")
    lines += [f"proxy {name:<7} {json.dumps(c)}" for name, c in counters.items()]
    rows = [[str(i), c.mb_per_s, f.mb_per_s, f"{f.mb_per_s / c.mb_per_s:.3f}"]
            for i, (c, f) in enumerate(zip(reads["clean"], reads["faulty"], strict=True), 1)]
    title = (f"s3faults benchmark: {args.size_mib} MiB segment on s3rver behind fault proxies; faults: "
             f"{args.slowdown:.0%} 503 SlowDown, {args.reset:.0%} resets mid-body, {args.stall:.0%} stalls of "
             f"{args.stall_s:g} s; tier2_read_timeout_s {base.tier2_read_timeout_s:g}")
    return Report(title, [lines, table(["round", "(a) fault-free MB/s", "(b) faults MB/s", "(b)/(a)"], rows)], checks,
                  {"written": written, "outage": outage, "reads": reads, "counters": counters})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_rounds_arguments(parser, 128, 2, "store, S3 server data")
    parser.add_argument("--slowdown", type=float, default=0.10, help="rate of 503 SlowDown (default 0.10)")
    parser.add_argument("--reset", type=float, default=0.02, help="rate of resets mid-body (default 0.02)")
    parser.add_argument("--stall", type=float, default=0.02, help="rate of stalls mid-body (default 0.02)")
    parser.add_argument("--stall-s", type=float, default=10.0, help="length of a stall in s (default 10)")
    parser.add_argument("--outage-s", type=float, default=10.0, help="length of the outage phase in s (default 10; 0: none)")
    parser.add_argument("--read-timeout-s", type=float, default=None,
                        help="the stores' tier2_read_timeout_s (default: the default, 1 s per MiB); a large value "
                        "shows what stalls cost without deadlines and hedging")


def run(args: argparse.Namespace) -> int:
    return run_scenario("s3faults", args, lambda directory: measure(directory, args))
