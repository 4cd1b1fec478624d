"""Running one benchmark command: options, scratch directory, report.

Every command runs through ``run_scenario``: it checks ``--dir`` (a directory on a real
disk: fdatasync and the page cache of a RAM filesystem cost nothing), measures in a fresh
``tmp-tierfs-bench-*`` directory under it (always removed), and prints the ``Report``
the scenario returns: a line on the machine, the sections, the checks. With ``--json``
the report goes to stderr and a JSON object of every figure to stdout. A missed target
is reported, not an error: the exit code is 0 either way (1 if the benchmark could not
run, 2 for bad options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from benchmarks.harness.figures import Check, Throughput

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
T = TypeVar("T")


class UsageError(ValueError):
    """Options that cannot be run (the message says which)."""


@dataclasses.dataclass
class Report:
    title: str
    sections: list[list[str]] = dataclasses.field(default_factory=list)
    checks: list[Check] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)  # the JSON figures


def say(text: str) -> None:
    """A progress line on stderr."""
    print(text, file=sys.stderr, flush=True)


def alternate(index: int, items: Sequence[T]) -> list[T]:
    """``items`` in order in even rounds, reversed in odd ones: neither always goes first."""
    return list(items if index % 2 == 0 else items[::-1])


def table(header: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 1) -> list[str]:
    """Aligned columns: the first left-aligned, the others right; floats with ``digits``."""
    cells = [[c if isinstance(c, str) else f"{c:,.{digits}f}" if isinstance(c, float) else f"{c:,}"
              for c in row] for row in rows]
    widths = [max(len(str(line[i])) for line in [list(header), *cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        return " ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))

    head = line(list(header))
    return [head, "-" * len(head), *(line(row) for row in cells)]


def rounds_table(columns: Mapping[str, Sequence[Throughput]], ratios: Sequence[tuple[str, str]] = (),
                 digits: int = 1) -> list[str]:
    """MB/s of each column and each ratio (numerator, denominator), a row per round,
    then the medians (of a ratio: the median of the rounds' own)."""
    rounds = len(next(iter(columns.values())))
    per_round = [[*(c[i].mb_per_s for c in columns.values()),
                  *(columns[a][i].mb_per_s / columns[b][i].mb_per_s for a, b in ratios)] for i in range(rounds)]
    medians = [statistics.median(column) for column in zip(*per_round, strict=True)]
    width = len(columns)
    rows = [[label, *(f"{v:,.{digits}f}" for v in values[:width]), *(f"{v:.3f}" for v in values[width:])]
            for label, values in [*((f"round {i + 1}", r) for i, r in enumerate(per_round)), ("median", medians)]]
    return table(["MB/s", *columns, *(f"{a}/{b}" for a, b in ratios)], rows)


def filesystem_of(path: Path) -> tuple[str, str]:
    """(device, filesystem type) of the mount holding ``path`` (the longest match)."""
    real, best, found = os.path.realpath(path), -1, ("unknown", "unknown")
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            device, mount_point, fs_type = line.split()[:3]
            mount_point = mount_point.replace("\\040", " ")
            if (real == mount_point or real.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) >= best:
                best, found = len(mount_point), (device, fs_type)
    return found


def add_scratch_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dir`` and ``--json``, the options every benchmark has."""
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="create the scratch directory here; must be on a real disk, the one to measure "
                        "(default: the current directory)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON object of all figures on stdout (the report goes to stderr)")


def positive(text: str) -> int:
    """An option's type: an integer >= 1."""
    if (value := int(text)) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return value


def size_rounds(parser: argparse.ArgumentParser, size_mib: int, rounds: int) -> None:
    parser.add_argument("--size-mib", type=positive, default=size_mib, help=f"segment size in MiB (default {size_mib})")
    parser.add_argument("--rounds", type=positive, default=rounds, help=f"rounds (default {rounds}; medians)")


def as_json(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else str(value)


def run_scenario(name: str, args: argparse.Namespace, measure: Callable[[Path], Report]) -> int:
    """Measure in a fresh ``tmp-tierfs-bench-*`` directory under ``args.dir`` (always
    removed) and print the report."""
    directory = None
    try:
        if not args.dir.is_dir() or filesystem_of(args.dir)[1] in RAM_FILESYSTEMS:
            raise UsageError(f"--dir {args.dir}: not a directory on a real disk (tmpfs and ramfs are RAM)")
        directory = Path(tempfile.mkdtemp(prefix="tmp-tierfs-bench-", dir=args.dir)).resolve()
        device, fs_type = filesystem_of(directory)
        machine: dict[str, Any] = {
            "cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(), "python": platform.python_version(),
            "trio": trio.__version__, "directory": str(directory), "filesystem": {"device": device, "fs_type": fs_type},
            "loadavg": os.getloadavg()}
        report = measure(directory)
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except (RuntimeError, OSError) as e:
        print(f"cannot run the {name} benchmark: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    out = sys.stderr if args.json else sys.stdout
    fs = machine["filesystem"]
    print(f"{report.title}\nmachine: {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']} "
          f"({machine['directory']}), load {' '.join(f'{v:.2f}' for v in machine['loadavg'])}\n", file=out)
    width = max((len(check.name) for check in report.checks), default=0)
    for section in [*report.sections, [check.text(width) for check in report.checks]]:
        if section:
            print("\n".join(section) + "\n", file=out)
    if args.json:
        print(json.dumps({"benchmark": name, "machine": machine, **report.data,
                          "checks": [check.as_json() for check in report.checks]}, indent=2, default=as_json))
    return EXIT_OK
