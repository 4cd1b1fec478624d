"""tierfs quickstart: write segments, read them back, and see where the bytes live.

Runs on embedded defaults (PD durability, 4 MiB / 1 s flush triggers, 64 MiB chunks,
tier-2 in <data dir>/chunks); only the data directory is chosen here, a fresh
``demo-data/`` next to the repository, so the demo can be run again and again.

    .venv/bin/python examples/quickstart.py [DATA_DIR]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import trio

from tierfs import StoreConfig, open_store


def where(info) -> str:  # type: ignore[no-untyped-def]
    in_journal = info.appended_length - info.flushed_length
    return (
        f"{info.name}: {info.length} bytes readable, {info.flushed_length} in "
        f"{info.chunk_count} tier-2 chunk(s), {in_journal} only in the journal"
    )


async def main(data_dir: Path) -> None:
    shutil.rmtree(data_dir, ignore_errors=True)
    config = StoreConfig(data_dir=data_dir)
    print(f"data dir: {data_dir}  tier-2: {config.chunk_store_url}")

    async with open_store(config) as store:
        await store.mkdir("logs")
        await store.create("logs/app.log")
        for i in range(1000):
            await store.append("logs/app.log", f"event {i:04d} user=u{i % 7}\n".encode())
        info = await store.stat("logs/app.log")
        print("after 1000 PD appends (each acknowledged after fdatasync):")
        print("  " + where(info))

        await store.create("logs/metrics", durability="vd")
        await store.append("logs/metrics", b"cpu=0.42\n")
        vd = await store.stat("logs/metrics")
        print(f"VD append: appended {vd.appended_length} bytes, readers see {vd.length} until sync")
        print(f"  sync -> durable length {await store.sync('logs/metrics')}")

        await store.flush()
        print("after the storage writer flushed to tier-2:")
        for segment in await store.walk_segments():
            print("  " + where(segment))
        for chunk in await store.chunk_layout("logs/app.log"):
            print(f"  chunk {chunk['url']} bytes {chunk['start']}..{chunk['end']}")
        await store.append("logs/app.log", b"one more line after the flush\n")

    print("reopening (a clean close flushed everything; after a crash, recovery replays the journal):")
    async with open_store(config) as store:
        data = await store.read("logs/app.log")
        print(f"  first line: {data.splitlines()[0].decode()!r}, last: {data.splitlines()[-1].decode()!r}")
        print("  " + where(await store.stat("logs/app.log")))
        report = await store.fsck()
        print(f"fsck: {report.segments} segments, {report.chunks} chunks, "
              f"{report.bytes_checked} bytes verified, problems: {len(report.problems)}")
        stats = store.statistics()
        print(f"epoch {stats.epoch}, journal {stats.journal_bytes} bytes in {stats.journal_files} file(s)")
    print("try the CLI too:  .venv/bin/tierfs --data-dir", data_dir, "cat logs/app.log | tail -3")


if __name__ == "__main__":
    default = Path(__file__).resolve().parent.parent / "demo-data"
    trio.run(main, Path(sys.argv[1]) if len(sys.argv) > 1 else default)
