"""Append JSON events to a tierfs segment through fsspec, as an application would: one
event per line, a batch of them per append (each ``flush`` is one atomic append), until
SECONDS have passed. Prints how many events it sent.

    python produce.py tierfs://events/web --seconds 30 [--rate 50]

The daemon is the one ``TIERFS_DATA_DIR`` (or ``TIERFS_URL``) names; with neither, the
default data dir's.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import fsspec

KINDS = ("view", "click", "buy")


def event(rng: random.Random, source: str) -> bytes:
    kind = rng.choices(KINDS, weights=(70, 25, 5))[0]
    amount = round(rng.uniform(1, 200), 2) if kind == "buy" else 0.0
    fields = {"ts": round(time.time(), 3), "user": f"{source}-u{rng.randrange(300)}", "kind": kind, "amount": amount}
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the segment to append to, e.g. tierfs://events/web")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=50, help="events per second")
    args = parser.parse_args()
    rng, sent = random.Random(), 0
    source = args.url.rstrip("/").rsplit("/", 1)[-1]
    end = time.monotonic() + args.seconds
    with fsspec.open(args.url, "ab") as segment:
        while time.monotonic() < end:
            batch = [event(rng, source) for _ in range(max(1, args.rate // 10))]
            segment.write(b"".join(batch))
            segment.flush()  # one append: durable when flush returns
            sent += len(batch)
            time.sleep(0.1)
    print(f"sent {sent} events to {args.url}")


if __name__ == "__main__":
    main()
