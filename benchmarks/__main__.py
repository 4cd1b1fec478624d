"""``python -m benchmarks <benchmark> [options]``: run one tierfs benchmark.

Run it from the repository root (or with the root on ``PYTHONPATH``), with tierfs
installed in the interpreter (``.venv/bin/python -m benchmarks append --seconds 1``).

Each benchmark is one scenario: a module of this package, or the ``command`` module of a
sub-package when the scenario has helper modules (a child process, a report), that
provides ``HELP`` (a one-line summary), ``add_arguments(parser)`` and ``run(args) ->
int``; the machinery they share is ``benchmarks.harness``. A benchmark module must import cheaply (heavy optional
dependencies, e.g. for FUSE or Spark, are imported inside ``run``), because building the
parser imports every registered module. Add one by adding its module to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Subcommand name -> module. The names are cited by docs/PERFORMANCE.md: keep them.
BENCHMARKS: dict[str, str] = {
    "append": "benchmarks.append",
    "read": "benchmarks.read",
    "fsspec": "benchmarks.fsspec.command",
    "fuse": "benchmarks.fuse.command",
    "offload": "benchmarks.offload",
    "s3faults": "benchmarks.s3faults",
    "spark": "benchmarks.spark.command",
    "instructions": "benchmarks.instructions",
    "cluster": "benchmarks.cluster.command",
    "peers": "benchmarks.peers.command",
    "followers": "benchmarks.followers.command",
    "scale": "benchmarks.scale.command",
    "mixed": "benchmarks.mixed.command",
    "tail": "benchmarks.tail_latency",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="tierfs benchmarks: tierfs next to the physical ceilings of the same machine, measured in the same run.",
    )
    subcommands = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        subparser = subcommands.add_parser(name, help=module.HELP, description=module.__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(subparser)
        subparser.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_code: int = args.run(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
