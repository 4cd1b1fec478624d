"""Instructions per operation on the engine's hot paths, counted by callgrind: exact where
wall-clock figures on a shared 2-core machine move by tens of percent, so two versions of
tierfs can be compared by running it in each checkout. Operations: ``vd-append``, a 1
KiB append to a VD segment, and ``warm-read``, a 4 KiB read at a random offset of a
flushed 16 MiB segment whose blocks are all cached.

Each runs in a child process (``python -m benchmarks.instructions OP N CEILING DIR``)
under ``valgrind --tool=callgrind`` twice, with ``--small`` and ``--small + --count``
operations after the same set-up; the difference of the two totals over ``--count`` is
one operation. The ceiling beside it is the same loop with the engine call replaced by
one trio checkpoint: what any trio-based Python operation costs at the least.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
from pathlib import Path

import trio

from benchmarks import child_command, child_environment
from benchmarks.harness.scenario import Report, UsageError, positive, table
from tierfs import StoreConfig, open_store

HELP = "CPU instructions per VD append and per warm 4 KiB read (callgrind; exact, not timed)"
OPERATIONS = ("vd-append", "warm-read")
SEGMENT_BYTES = 16 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--small", type=positive, default=1000, help="operations in the short run")
    parser.add_argument("--count", type=positive, default=5000, help="extra operations in the long run")


async def child(op: str, n: int, ceiling: bool, scratch: Path) -> None:
    async with open_store(StoreConfig(data_dir=scratch, durability="vd" if op == "vd-append" else "pd")) as store:
        await store.create("s")
        if op == "warm-read":
            for _ in range(SEGMENT_BYTES >> 20):
                await store.append("s", b"y" * (1 << 20))
            await store.flush("s")
            await store.read("s")  # every block into the cache
        rng, payload = random.Random(1), b"x" * 1024
        for _ in range(n):
            if ceiling:
                await trio.lowlevel.checkpoint()
            elif op == "vd-append":
                await store.append("s", payload)
            else:
                await store.read("s", rng.randrange(SEGMENT_BYTES - 4096), 4096)


def instructions(op: str, n: int, ceiling: bool, scratch: Path) -> int:
    data_dir = scratch / f"{op}-{n}-{int(ceiling)}"
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               *child_command("benchmarks.instructions", op, str(n), str(int(ceiling)), str(data_dir))]
    data_dir.mkdir()
    done = subprocess.run(command, capture_output=True, text=True, env=child_environment())
    shutil.rmtree(data_dir)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {done.stderr[-2000:]}")
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1].strip())
    raise RuntimeError("callgrind printed no instruction count")


def measure(scratch: Path, args: argparse.Namespace) -> Report:
    if shutil.which("valgrind") is None:
        raise UsageError("instructions: valgrind is not installed (apt-get install valgrind)")
    rows, found = [], {}
    for op in OPERATIONS:
        per_op = [(instructions(op, args.small + args.count, ceiling, scratch)
                   - instructions(op, args.small, ceiling, scratch)) / args.count for ceiling in (False, True)]
        found[op] = {"tierfs": per_op[0], "ceiling": per_op[1]}
        rows.append([op, f"{per_op[0]:,.0f}", f"{per_op[1]:,.0f}", f"{per_op[0] - per_op[1]:,.0f}"])
    return Report(f"instructions per operation (callgrind), {args.count} operations measured",
                  [table(["operation", "tierfs", "ceiling", "tierfs - ceiling"], rows)], [], {"instructions": found})


if __name__ == "__main__":
    import trio

    trio.run(child, sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", Path(sys.argv[4]))
