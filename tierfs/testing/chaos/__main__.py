"""``python -m tierfs.testing.chaos``: one seeded run (or many), exit 1 on any broken promise."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tierfs.testing.chaos.cluster_run import CLUSTER_NEMESES, run_cluster
from tierfs.testing.chaos.nemeses import NEMESES
from tierfs.testing.chaos.runner import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.chaos",
                                     description="faults against real daemons, every acknowledgement checked")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed on")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--nemeses", default=None,
                        help=f"comma-separated, of {', '.join(NEMESES)} (one host) or {', '.join(CLUSTER_NEMESES)} "
                             "(--cluster); default: all of them")
    parser.add_argument("--s3", action="store_true", help="tier-2 on moto's S3 behind the fault proxy")
    parser.add_argument("--cluster", action="store_true", help="three daemons on a real PostgreSQL")
    parser.add_argument("--outage-s", type=float, default=None,
                        help="--cluster: how long database_outage keeps PostgreSQL down (default: a few leases)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the run's files here")
    args = parser.parse_args(argv)
    known = CLUSTER_NEMESES if args.cluster else NEMESES
    nemeses = [n for n in args.nemeses.split(",") if n] if args.nemeses else list(known)
    unknown = [n for n in nemeses if n not in known]
    if unknown:
        parser.error(f"unknown nemeses: {', '.join(unknown)}")
    failed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        root = args.dir / f"seed-{seed}" if args.dir else Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        result = (run_cluster(seed, args.steps, root, nemeses=nemeses, log=log, outage_s=args.outage_s)
                  if args.cluster
                  else run(seed, args.steps, root, nemeses=nemeses, s3=args.s3, log=log))
        print(json.dumps({"seed": seed, "nemeses": result.nemeses, **result.summary,
                          "problems": result.problems}))
        if result.problems:
            failed += 1
            print(f"replay: {result.replay}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
