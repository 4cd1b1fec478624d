"""S3 faults benchmark: cold reads through a fault-injecting proxy next to fault-free ones,
and every acknowledged byte read back.

s3rver and three fault proxies (``tierfs.testing.faults.fault_proxy``, each a process): *write*
and *faulty* inject 10 % 503 SlowDown, 2 % resets mid-body and 2 % stalls of 10 s;
*clean* none. Through *write*: a segment of ``--size-mib`` (128) MiB by 1 MiB VD appends,
flushed; then an outage of ``--outage-s`` (10), *write* resetting every
connection while up to 64 MiB more are appended: how long the appends took and how long
after the outage tier-2 held them all (that segment is read back through *clean*). Then
``--rounds`` (2), the order alternating: (a) a cold sequential read through *clean* (a
fresh store, default configuration or ``--read-timeout-s``), each piece compared; (b)
the same through *faulty*. Targets: (b)/(a) >= 0.5, every acknowledged byte read back
equal, none different.
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
from benchmarks.harness.scenario import Report, alternate, rounds_table, say, size_rounds
from tierfs import StoreConfig, open_store

HELP = "cold S3 reads through 503s, resets and stalls vs fault-free; bytes acked vs read back"
SEGMENT, OUTAGE_SEGMENT = "bench/faults", "bench/outage"
OUTAGE_MAX_BYTES = 64 * MiB  # well below max_backlog_bytes
FAULTS = {"--slowdown": 0.10, "--reset": 0.02, "--stall": 0.02, "--stall-s": 10.0}


@contextmanager
def fault_proxy(upstream: str, faults: bool, seed: int, counters: dict[str, int], log_path: Path,
                outage_s: float = 0.0) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``tierfs.testing.faults.fault_proxy`` in its own process: (its URL, the process); its counters."""
    command = [sys.executable, "-m", "tierfs.testing.faults.fault_proxy", upstream, "--seed", str(seed), "--outage-s",
               str(outage_s), *(str(word) for option in FAULTS.items() if faults for word in option)]
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
    async with open_store(config) as store:
        await store.create(name, durability="vd", make_parents=True)
        if outage is not None:
            outage[0].send_signal(signal.SIGUSR1)  # S3 unreachable through the proxy for its --outage-s
        started = perf_counter()
        for start in range(0, len(payload), MiB):
            await store.append(name, payload[start : start + MiB])
        appended_s = perf_counter() - started
        if outage is None:
            await store.flush()
            return {"acked_bytes": len(payload), "flush_s": perf_counter() - started - appended_s}
        await trio.sleep(max(0.0, outage[1] - appended_s))
        seg, ended = store.table.segment(name), perf_counter()
        flushed_during = seg.flushed_length
        while seg.flushed_length < len(payload):
            await trio.sleep(0.05)
        return {"acked_bytes": len(payload), "append_s": appended_s, "flushed_during_bytes": flushed_during,
                "caught_up_s": perf_counter() - ended}


async def cold_read(config: Any, payload: bytes, name: str = SEGMENT) -> tuple[float, int, int]:
    """Seconds, bytes equal to the payload, bytes different (a missing tail is not equal)."""
    equal = different = 0
    async with open_store(config) as store:
        reader, started = store.open_reader(name), perf_counter()
        for offset in range(0, len(payload), MiB):
            data, expected = await reader.read(offset, MiB), payload[offset : offset + MiB]
            same = len(data) if data == expected else sum(a == b for a, b in zip(data, expected, strict=False))
            equal, different = equal + same, different + len(data) - same
        return perf_counter() - started, equal, different


def measure(directory: Path, args: argparse.Namespace) -> Report:
    size, payload = args.size_mib * MiB, make_payload(args.size_mib * MiB, seed=15)
    counters: dict[str, dict[str, int]] = {"write": {}, "clean": {}, "faulty": {}}
    settings = {} if args.read_timeout_s is None else {"tier2_read_timeout_s": args.read_timeout_s}
    with s3.s3_server(directory / "s3rver") as endpoint:
        base = StoreConfig(data_dir=directory / "data", tier2_url=f"s3://{s3.BUCKET}/chunks", **settings)

        def through(proxy_url: str) -> StoreConfig:
            return base.replace(tier2_options=endpoint.storage_options(proxy_url))

        def proxy(kind: str, seed: int, outage_s: float = 0.0) -> Any:
            return fault_proxy(endpoint.url, kind != "clean", seed, counters[kind], directory / f"proxy-{kind}.log",
                               outage_s)

        outage_payload = payload[:OUTAGE_MAX_BYTES]
        with proxy("write", 1, args.outage_s) as (url, process):
            written = trio.run(append_all, through(url), SEGMENT, payload)
            say(f"written: {written['acked_bytes']:.0f} bytes acknowledged, flushed in {written['flush_s']:.1f} s")
            outage = trio.run(append_all, through(url), OUTAGE_SEGMENT, outage_payload, (process, args.outage_s))
        reads: dict[str, list[Throughput]] = {"(a)": [], "(b)": []}
        least_equal = size
        with proxy("clean", 2) as (clean, _), proxy("faulty", 3) as (faulty, _):
            _, outage_equal, different = trio.run(cold_read, through(clean), outage_payload, OUTAGE_SEGMENT)
            for index in range(args.rounds):
                for key, url in alternate(index, [("(a)", clean), ("(b)", faulty)]):
                    seconds, equal, wrong = trio.run(cold_read, through(url), payload)
                    least_equal, different = min(least_equal, equal), different + wrong
                    reads[key].append(Throughput(key, size, seconds))
                say(f"round {index + 1}/{args.rounds}: fault-free {reads['(a)'][-1].mb_per_s:.0f} MB/s, faults "
                    f"{reads['(b)'][-1].mb_per_s:.0f} MB/s")
    checks = [Check.over("(b)/(a) cold read, faults vs none", ratios(reads["(b)"], reads["(a)"]), 0.5, True),
              Check("bytes read back / acknowledged", least_equal / written["acked_bytes"], 1.0, True),
              Check("bytes read back different", float(different), 0.0, False),
              Check("outage: read back / acknowledged", outage_equal / outage["acked_bytes"], 1.0, True)]
    lines = [f"acknowledged {written['acked_bytes']:.0f} bytes; flush through faults {written['flush_s']:.1f} s",
             f"outage {args.outage_s:g} s: {outage['acked_bytes']:.0f} bytes acknowledged in {outage['append_s']:.2f} s, "
             f"{outage['flushed_during_bytes']:.0f} in tier-2 at its end, all {outage['caught_up_s']:.1f} s after it"]
    lines += [f"proxy {name:<7} {json.dumps(c)}" for name, c in counters.items()]
    title = (f"s3faults benchmark: {args.size_mib} MiB segment on s3rver behind fault proxies; faults: 10 % 503 "
             f"SlowDown, 2 % resets mid-body, 2 % stalls of 10 s; tier2_read_timeout_s {base.tier2_read_timeout_s:g}; "
             "(a) fault-free, (b) through faults")
    return Report(title, [lines, rounds_table(reads, [("(b)", "(a)")])], checks,
                  {"written": written, "outage": outage, "reads": reads, "counters": counters})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size_rounds(parser, 128, 2)
    parser.add_argument("--outage-s", type=float, default=10.0, help="length of the outage phase in s (default 10)")
    parser.add_argument("--read-timeout-s", type=float, default=None,
                        help="the stores' tier2_read_timeout_s (default: the default, 1 s per MiB); a large value "
                        "shows what stalls cost without deadlines and hedging")
