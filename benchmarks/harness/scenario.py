"""Running one benchmark command: options, scratch directory, report.

Every command runs ``run_scenario``: it checks ``--dir`` (a directory on a real disk:
fdatasync and the page cache of a RAM filesystem cost nothing), measures in a fresh
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
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from benchmarks.harness.figures import Check

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
SCRATCH_PREFIX = "tmp-tierfs-bench-"


class UsageError(ValueError):
    """Options that cannot be run (the message says which)."""


@dataclasses.dataclass
class Report:
    title: str
    sections: list[list[str]] = dataclasses.field(default_factory=list)
    checks: list[Check] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)  # the JSON figures


def table(header: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 1) -> list[str]:
    """Aligned columns: the first left-aligned, the others right; floats with ``digits``."""
    cells = [[c if isinstance(c, str) else f"{c:,.{digits}f}" if isinstance(c, float) else f"{c:,}"
              for c in row] for row in rows]
    widths = [max(len(str(line[i])) for line in [list(header), *cells]) for i in range(len(header))]

    def line(values: Sequence[str]) -> str:
        return " ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))

    head = line(list(header))
    return [head, "-" * len(head), *(line(row) for row in cells)]


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


def describe_machine(directory: Path) -> dict[str, Any]:
    device, fs_type = filesystem_of(directory)
    return {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "python": platform.python_version(), "trio": trio.__version__, "directory": str(directory),
            "filesystem": {"device": device, "fs_type": fs_type}, "loadavg": os.getloadavg()}


def make_scratch_directory(parent: Path) -> Path:
    """A new ``tmp-tierfs-bench-*`` directory under ``parent`` on a real disk (the caller removes it)."""
    if not parent.is_dir():
        raise UsageError(f"--dir {parent} is not a directory")
    fs_type = filesystem_of(parent)[1]
    if fs_type in RAM_FILESYSTEMS:
        raise UsageError(f"{parent} is on {fs_type} (RAM): choose --dir on a real disk")
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)).resolve()


def add_scratch_arguments(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--dir`` and ``--json``, the options every benchmark has."""
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help=f"create the scratch directory{f' ({what})' if what else ''} here; must be on a real "
                        "disk, the one to measure (default: the current directory)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON object of all figures on stdout (the report goes to stderr)")


def add_size_rounds_arguments(parser: argparse.ArgumentParser, size_mib: int, rounds: int, what: str = "") -> None:
    parser.add_argument("--size-mib", type=int, default=size_mib, help=f"segment size in MiB (default {size_mib})")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rounds (default {rounds}; medians)")
    add_scratch_arguments(parser, what)


def at_least_one(args: argparse.Namespace, *names: str) -> None:
    """``UsageError`` unless every option in ``names`` (attribute names) is >= 1."""
    if min(getattr(args, name) for name in names) < 1:
        raise UsageError(", ".join("--" + name.replace("_", "-") for name in names) + " must be >= 1")


def as_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def run_scenario(name: str, args: argparse.Namespace, measure: Callable[[Path], Report],
                 errors: tuple[type[Exception], ...] = (RuntimeError, OSError)) -> int:
    """Measure in a fresh scratch directory under ``args.dir`` and print the report."""
    try:
        directory = make_scratch_directory(args.dir)
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    try:
        machine = describe_machine(directory)
        report = measure(directory)
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except errors as e:
        print(f"cannot run the {name} benchmark: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR
    finally:
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
