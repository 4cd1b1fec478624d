"""The fsspec benchmark's figures and report (``python -m benchmarks fsspec``; the
measurements and what they mean are in ``benchmarks/fsspec_api.py``): the rounds' and
cases' dataclasses, the read target, the text tables and the JSON document. The write
rounds' own figures and tables are in ``benchmarks/fsspec_writes.py``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any, TextIO

from benchmarks import fsspec_writes
from benchmarks.common import (
    Check,
    Latency,
    MiB,
    Throughput,
    checks_json,
    format_checks,
    print_sections,
)
from benchmarks.fsspec_writes import WriteResults

OPEN_READ_BYTES = MiB  # f.read() size on the fsspec file, (a) and (a')
CAT_RANGE_BYTES = 4 * MiB  # fs.cat_file range, (b) and (b')
SOCKET_PIECE_BYTES = MiB  # (c)
SMALL_READ_BYTES = 4096
APPEND_BYTES = 1024  # the timed small appends
TARGET_RATIO = 0.60  # (a) / (r), the module docstring of fsspec_api says why

LABELS = {
    "r": "(r) ceiling: pread + CRC32C of each 1 MiB block",
    "a": f"(a) fsspec.open rb, f.read({OPEN_READ_BYTES // MiB} MiB), direct",
    "a'": f"(a') engine in-process, reader.read({OPEN_READ_BYTES // MiB} MiB)",
    "b": f"(b) fs.cat_file, {CAT_RANGE_BYTES // MiB} MiB ranges, direct",
    "b'": f"(b') engine in-process, reader.read({CAT_RANGE_BYTES // MiB} MiB)",
    "d": "(d) as (a), direct_reads=False: all via daemon",
}


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
