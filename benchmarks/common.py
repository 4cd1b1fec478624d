"""Helpers shared by the benchmarks: the scratch directory on a real disk, the machine
description, percentiles, throughput and latency figures, seeded payloads, target checks.

Everything here is cheap to import (``python -m benchmarks --help`` imports every
benchmark module, and each imports this one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import trio

MiB = 1 << 20
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
SCRATCH_PREFIX = "tmp-tierfs-bench-"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
WARM_CACHE_MIN_BYTES = 300 * MiB


# ------------------------------------------------------------ disk and machine
@dataclasses.dataclass(frozen=True)
class Filesystem:
    device: str
    mount_point: str
    fs_type: str


def filesystem_of(path: Path) -> Filesystem:
    """The mount holding ``path``, from /proc/self/mounts (the last, longest match)."""
    real = os.path.realpath(path)
    best = Filesystem("unknown", "unknown", "unknown")
    try:
        with open("/proc/self/mounts") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return best
    for line in lines:
        device, mount_point, fs_type = line.split()[:3]
        mount_point = mount_point.replace("\\040", " ")
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and (best.mount_point == "unknown" or len(mount_point) >= len(best.mount_point)):
            best = Filesystem(device, mount_point, fs_type)
    return best


def describe_machine(directory: Path) -> dict[str, Any]:
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "trio": trio.__version__,
        "directory": str(directory),
        "filesystem": dataclasses.asdict(filesystem_of(directory)),
    }


def scratch_parent_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold a benchmark's scratch directory (None if it can):
    it must exist and be on a real disk (fdatasync and the page cache of a RAM
    filesystem cost nothing, so its figures would say nothing about a disk)."""
    if not directory.is_dir():
        return f"--dir {directory} is not a directory"
    fs_type = filesystem_of(directory).fs_type
    if fs_type in RAM_FILESYSTEMS:
        return f"{directory} is on {fs_type} (RAM): choose --dir on a real disk"
    return None


def make_scratch_directory(parent: Path) -> Path:
    """A new ``tmp-tierfs-bench-*`` directory under ``parent`` (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)).resolve()


# --------------------------------------------------------------------- figures
def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclasses.dataclass(frozen=True)
class Throughput:
    label: str
    nbytes: int
    seconds: float
    mb_per_s: float  # 10^6 bytes per second
    setup_s: float = 0.0  # untimed: the first request (HEAD) that sets up the S3 client

    @classmethod
    def of(cls, label: str, nbytes: int, seconds: float, setup_s: float = 0.0) -> Throughput:
        mb_per_s = nbytes / seconds / 1e6 if seconds > 0 else math.nan
        return cls(label, nbytes, seconds, mb_per_s, setup_s)


@dataclasses.dataclass(frozen=True)
class Latency:
    samples: int
    p50_us: float
    p99_us: float
    max_us: float

    @classmethod
    def of(cls, latencies_s: list[float]) -> Latency:
        ordered = sorted(latencies_s)
        return cls(
            samples=len(ordered),
            p50_us=percentile(ordered, 0.50) * 1e6,
            p99_us=percentile(ordered, 0.99) * 1e6,
            max_us=(ordered[-1] if ordered else math.nan) * 1e6,
        )


@dataclasses.dataclass(frozen=True)
class Check:
    """One target: ``value`` against ``limit``."""

    name: str
    value: float
    limit: float
    at_least: bool  # True: value must be >= limit; False: <= limit
    unit: str = ""

    @property
    def passed(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit


def checks_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(c), "passed": c.passed} for c in checks]


def print_sections(sections: list[list[str]], out: TextIO) -> None:
    """Blocks of report lines, each followed by an empty line."""
    for section in sections:
        for line in section:
            print(line, file=out)
        print(file=out)


def add_scratch_arguments(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--dir`` and ``--json``, the options every benchmark has."""
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("."),
        help=f"create the scratch directory{f' ({what})' if what else ''} here; must be on "
        "a real disk, the one to measure (default: the current directory)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON object of all figures on stdout (the table goes to stderr)",
    )


def format_checks(checks: list[Check], name_width: int = 36) -> list[str]:
    lines = []
    for check in checks:
        bound = ">=" if check.at_least else "<="
        verdict = "PASS" if check.passed else "FAIL"
        lines.append(
            f"{check.name:<{name_width}} {check.value:9.3f} {check.unit:<3} "
            f"({bound} {check.limit:g}) {verdict}"
        )
    return lines


# --------------------------------------------------------------------- data
def make_payload(size: int, seed: int) -> bytes:
    """Seeded random bytes (made 1 MiB at a time: randbytes is limited to < 2 GiBit)."""
    rng = random.Random(seed)
    return b"".join(rng.randbytes(min(MiB, size - offset)) for offset in range(0, size, MiB))


def warm_cache_bytes(size: int) -> int:
    """A block-cache budget that holds a whole ``size``-byte segment with room to spare."""
    return max(WARM_CACHE_MIN_BYTES, size + size // 4)


def run_in_scratch(
    name: str,
    parent: Path,
    as_json: bool,
    measure: Callable[[Path], Any],
    evaluate: Callable[[Any], Any],
    report: Callable[[dict[str, Any], Any, Any, Any], None],
    to_json: Callable[[dict[str, Any], Any, Any], dict[str, Any]],
    errors: tuple[type[Exception], ...] = (),
) -> int:
    """The common shape of a benchmark run: check the scratch parent, measure in a fresh
    scratch directory (always removed), evaluate the targets, print the table (to stderr
    with ``--json``) and the JSON. A target that fails still exits 0: it is reported."""
    problem = scratch_parent_problem(parent)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_USAGE
    directory = make_scratch_directory(parent)
    try:
        machine = describe_machine(directory)
        results = measure(directory)
    except errors as e:
        print(f"cannot run the {name} benchmark: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    checks = evaluate(results)
    report(machine, results, checks, sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(to_json(machine, results, checks), indent=2))
    return EXIT_OK


def add_size_rounds_arguments(parser: argparse.ArgumentParser, size_mib: int, rounds: int, what: str) -> None:
    """``--size-mib``, ``--rounds`` and the scratch options of a benchmark of rounds."""
    parser.add_argument("--size-mib", type=int, default=size_mib, help=f"segment size in MiB (default {size_mib})")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rounds (default {rounds}; medians)")
    add_scratch_arguments(parser, what)


def run_size_rounds(
    name: str,
    args: argparse.Namespace,
    measure: Callable[[Path, int, int], Any],
    evaluate: Callable[[Any], Any],
    report: Callable[[dict[str, Any], Any, Any, Any], None],
    to_json: Callable[[dict[str, Any], Any, Any], dict[str, Any]],
    errors: tuple[type[Exception], ...],
) -> int:
    """``run_in_scratch`` for a benchmark of rounds: checks ``--size-mib`` and
    ``--rounds``, then calls ``measure(directory, size_bytes, rounds)``."""
    if args.size_mib < 1 or args.rounds < 1:
        print("--size-mib and --rounds must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    return run_in_scratch(
        name, args.dir, args.json,
        lambda directory: measure(directory, args.size_mib * MiB, args.rounds),
        evaluate, report, to_json, errors=errors,
    )
