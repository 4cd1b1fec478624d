"""Child process of test_crash.py: concurrent PD appends, one line per acknowledgement.

Usage: python crash_writer.py DATA_DIR RUN_ID

Each record is self-describing: ``<run:writer:seq:len:payload>``; after ``append``
returns, the process prints ``segment offset length sha256`` and flushes stdout, so
every line the parent reads is an acknowledged append. Small thresholds make flushes,
chunk rollover and journal-file deletion happen while the parent kills us.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import trio

from tierfs import open_store
from tierfs.testing.harness import small_config

SEGMENTS = ["crash/s0", "crash/s1", "crash/s2"]
WRITERS = 6


async def main(data_dir: Path, run_id: int) -> None:
    config = small_config(
        data_dir, flush_bytes=16 << 10, flush_interval_s=0.02, max_chunk_bytes=48 << 10,
        max_flush_bytes=32 << 10, journal_file_bytes=32 << 10, durability="pd",
    )
    async with open_store(config) as store:
        existing = {info.name for info in await store.walk_segments()}
        for name in SEGMENTS:
            if name not in existing:
                await store.create(name, make_parents=True)
        print("ready", flush=True)

        async def writer(w: int) -> None:
            rng = random.Random(run_id * 1000 + w)
            seq = 0
            while True:
                segment = SEGMENTS[(w + seq) % len(SEGMENTS)]
                payload = rng.randbytes(rng.randint(1, 3000)).hex()[: rng.randint(1, 3000)]
                record = f"<{run_id}:{w}:{seq}:{len(payload)}:{payload}>".encode()
                offset = await store.append(segment, record)
                digest = hashlib.sha256(record).hexdigest()
                print(f"{segment} {offset} {len(record)} {digest}", flush=True)
                seq += 1

        async with trio.open_nursery() as nursery:
            for w in range(WRITERS):
                nursery.start_soon(writer, w)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), int(sys.argv[2]))
