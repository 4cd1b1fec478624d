"""``python -m benchmarks <benchmark> [options]``: run one tierfs benchmark.

Run it from the repository root (or with the root on ``PYTHONPATH``), with tierfs
installed in the interpreter (``.venv/bin/python -m benchmarks append --seconds 1``).

Each benchmark is a module of this package that provides:

- ``HELP``: a one-line summary for ``--help``;
- ``add_arguments(parser)``: its own options;
- ``run(args) -> int``: run it, print its report, return the exit code.

A benchmark module must import cheaply (optional heavy dependencies, e.g. for FUSE or
Spark, are imported inside ``run``), because building the parser imports every
registered module. Add a benchmark by adding its module name to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommand name -> module.
BENCHMARKS: dict[str, str] = {
    "append": "benchmarks.append",
    "read": "benchmarks.read",
    "fsspec": "benchmarks.fsspec_api",
    "fuse": "benchmarks.fuse_mount",
    "offload": "benchmarks.offload",
    "s3faults": "benchmarks.s3faults",
    "spark": "benchmarks.spark",
    "instructions": "benchmarks.instructions",
    "cluster": "benchmarks.cluster",
    "peers": "benchmarks.peers",
    "followers": "benchmarks.followers",
    "scale": "benchmarks.scale",
    "mixed": "benchmarks.mixed",
    "tail": "benchmarks.tail_latency",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="tierfs benchmarks: tierfs next to the physical ceilings of the same "
        "machine, measured in the same run.",
    )
    subcommands = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        subparser = subcommands.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_code: int = args.run(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
