"""``python -m benchmarks <benchmark> [options]``: run one tierfs benchmark, from the
repository root with tierfs installed (``.venv/bin/python -m benchmarks append --seconds 1``).

Each benchmark is one scenario: a module of this package, or the ``command`` module of a
sub-package, that provides ``HELP`` (a one-line summary), ``add_arguments(parser)`` and
``measure(directory, args) -> Report``, run by ``harness.scenario.run_scenario`` with
``--dir`` and ``--json``. Building the parser imports every registered module, so none
may import FUSE, Spark or S3 clients at its top. Add one by adding it to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from benchmarks.harness.scenario import add_scratch_arguments, run_scenario

# Subcommand name -> module. The names are cited by docs/PERFORMANCE.md: keep them.
BENCHMARKS: dict[str, str] = {
    "append": "benchmarks.append", "read": "benchmarks.read", "fsspec": "benchmarks.fsspec.command",
    "fuse": "benchmarks.fuse", "offload": "benchmarks.offload", "s3faults": "benchmarks.s3faults",
    "spark": "benchmarks.spark.command", "instructions": "benchmarks.instructions", "cluster": "benchmarks.cluster",
    "peers": "benchmarks.peers.command", "followers": "benchmarks.followers.command", "scale": "benchmarks.scale",
    "mixed": "benchmarks.mixed", "tail": "benchmarks.tail_latency",
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
        add_scratch_arguments(subparser)
        subparser.set_defaults(measure=module.measure)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_scenario(args.benchmark, args, lambda directory: args.measure(directory, args))


if __name__ == "__main__":
    sys.exit(main())
