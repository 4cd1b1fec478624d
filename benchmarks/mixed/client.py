"""The client processes of ``benchmarks mixed``: one role each, reporting one JSON line.

    python -m benchmarks.mixed.client DATA_DIR writer N QUOTA_BYTES
    python -m benchmarks.mixed.client DATA_DIR follower SEGMENT BYTES
    python -m benchmarks.mixed.client DATA_DIR reader N SEGMENT...   (until terminated)

Readers read through the daemon (``direct_reads=False``), so its block cache and
read-ahead are part of the load; writers and followers use ``tierfs://`` as users do.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import sys
import time


def _report(**figures: object) -> None:
    sys.stdout.write(json.dumps(figures) + "\n")
    sys.stdout.flush()


def _record(writer: int, index: int) -> bytes:
    rng = random.Random(writer * 1_000_003 + index)
    return rng.randbytes(rng.randrange(64 << 10, 1 << 20))


def writer(data_dir: str, writer: int, quota_bytes: int) -> None:
    from tierfs.fsspec_impl import TierFileSystem

    fs = TierFileSystem(data_dir=data_dir, skip_instance_cache=True)
    digest, written, index = hashlib.sha256(), 0, 0
    with fs.open(f"mixed/w{writer}", "ab") as f:
        while written < quota_bytes:
            data = _record(writer, index)
            f.write(data)
            f.flush()  # one atomic append per record
            digest.update(data)
            written += len(data)
            index += 1
    _report(role="writer", segment=f"mixed/w{writer}", bytes=written, sha256=digest.hexdigest())


def follower(data_dir: str, segment: str, expected_bytes: int) -> None:
    from tierfs.fsspec_impl import TierFileSystem

    fs = TierFileSystem(data_dir=data_dir, skip_instance_cache=True)
    digest, seen = hashlib.sha256(), 0
    while not fs.exists(segment):
        time.sleep(0.05)
    for piece in fs.follow(segment):
        digest.update(piece)
        seen += len(piece)
        if seen >= expected_bytes:
            break
    _report(role="follower", segment=segment, bytes=seen, sha256=digest.hexdigest())


def reader(data_dir: str, reader: int, segments: list[str]) -> None:
    from tierfs.fsspec_impl import TierFileSystem

    fs = TierFileSystem(data_dir=data_dir, skip_instance_cache=True, direct_reads=False)
    rng = random.Random(reader)
    reads = errors = 0
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    while not stopping:
        segment = rng.choice(segments)
        try:
            size = fs.size(segment)
        except FileNotFoundError:
            time.sleep(0.05)
            continue
        if size < 64 << 10:
            time.sleep(0.05)
            continue
        start = rng.randrange(0, size - (64 << 10))
        try:
            fs.cat_file(segment, start=start, end=start + (64 << 10))
            reads += 1
        except Exception:  # noqa: BLE001 - counted and reported, the run goes on
            errors += 1
    _report(role="reader", reads=reads, errors=errors)


def main(argv: list[str]) -> int:
    data_dir, role = argv[0], argv[1]
    if role == "writer":
        writer(data_dir, int(argv[2]), int(argv[3]))
    elif role == "follower":
        follower(data_dir, argv[2], int(argv[3]))
    elif role == "reader":
        reader(data_dir, int(argv[2]), argv[3:])
    else:
        raise SystemExit(f"unknown role {role!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
