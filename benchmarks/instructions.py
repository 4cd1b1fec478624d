"""Instructions per operation on the engine's hot paths, counted by callgrind.

Wall-clock figures on a shared 2-core machine move by tens of percent from run to run;
instruction counts do not (the same binary, inputs and environment give the same count
whatever else the machine runs). This benchmark counts the CPU instructions one
operation costs in the engine in-process, so two versions of tierfs can be compared
exactly: run it in each checkout, one after the other.

Operations (``--ops``, default all):

- ``vd-append``: a 1 KiB append to a VD segment (journal frame, tail entry, write(2) of
  the batch, no fdatasync on the path);
- ``warm-read``: a 4 KiB read at a random offset of a flushed 16 MiB segment whose blocks
  are all in the block cache.

Each operation runs in a child process under ``valgrind --tool=callgrind`` twice, with
``--small`` and ``--small + --count`` operations after the same set-up; the difference
of the two totals divided by ``--count`` is the cost of one operation, set-up and
interpreter start cancelled out. The ceiling printed beside it is the same loop with
the engine call replaced by a call that does nothing but await a trio checkpoint: what
any trio-based Python operation costs at the least.

Needs Debian's ``valgrind``; without it the benchmark says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HELP = "CPU instructions per VD append and per warm 4 KiB read (callgrind; exact, not timed)"
OPERATIONS = ("vd-append", "warm-read")
SEGMENT_BYTES = 16 << 20
READ_BYTES = 4096
APPEND_BYTES = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", nargs="+", choices=OPERATIONS, default=list(OPERATIONS))
    parser.add_argument("--small", type=int, default=1000, help="operations in the short run")
    parser.add_argument("--count", type=int, default=5000, help="extra operations in the long run")
    parser.add_argument("--dir", default=".", help="scratch directory parent (on the data disk)")
    parser.add_argument("--child", nargs=3, metavar=("OP", "N", "CEILING"), help=argparse.SUPPRESS)


async def _child(op: str, n: int, ceiling: bool, scratch: Path) -> None:
    import trio

    from tierfs import StoreConfig, open_store

    durability = "vd" if op == "vd-append" else "pd"
    async with open_store(StoreConfig(data_dir=scratch, durability=durability)) as store:
        await store.create("s")
        if op == "warm-read":
            for _ in range(SEGMENT_BYTES >> 20):
                await store.append("s", b"y" * (1 << 20))
            await store.flush("s")
            await store.read("s")  # every block into the cache
        rng = random.Random(1)
        payload = b"x" * APPEND_BYTES
        for _ in range(n):
            if ceiling:
                await trio.lowlevel.checkpoint()
            elif op == "vd-append":
                await store.append("s", payload)
            else:
                await store.read("s", rng.randrange(SEGMENT_BYTES - READ_BYTES), READ_BYTES)


def _instructions(op: str, n: int, ceiling: bool, parent: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="tmp-tierfs-bench-", dir=parent) as scratch:
        command = [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-m", "benchmarks", "instructions",
            "--dir", scratch, "--child", op, str(n), "1" if ceiling else "0",
        ]
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {done.stderr[-2000:]}")
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].strip())
    raise RuntimeError("callgrind printed no instruction count")


def run(args: argparse.Namespace) -> int:
    if args.child:
        import trio

        op, n, ceiling = args.child
        trio.run(_child, op, int(n), ceiling == "1", Path(args.dir))
        return 0
    if shutil.which("valgrind") is None:
        print("instructions: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    parent = Path(args.dir).resolve()
    print(f"instructions per operation (callgrind), {args.count} operations measured")
    print(f"{'operation':<12} {'tierfs':>10} {'ceiling':>10} {'tierfs - ceiling':>18}")
    for op in args.ops:
        per_op = {}
        for ceiling in (False, True):
            short = _instructions(op, args.small, ceiling, parent)
            long = _instructions(op, args.small + args.count, ceiling, parent)
            per_op[ceiling] = (long - short) / args.count
        print(f"{op:<12} {per_op[False]:>10,.0f} {per_op[True]:>10,.0f} {per_op[False] - per_op[True]:>18,.0f}")
    return 0
