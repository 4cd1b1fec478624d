"""A follower process of the ``followers`` benchmark:
``python -m benchmarks.followers_child`` (JSON lines on stdin/stdout, see ``children``).

Request 1: ``{"source": "tierfs" | "reference", "address": URL or socket path,
"segments": [name, ...], "followers": [segment index of each follower, ...],
"ready_timeout_s": S, "sample_every": K, "clients": "threads" | "trio", "via":
"follow" | "api"}``. With
``threads`` it starts one thread per follower, all at once:

- ``tierfs``: ``TierClient.follow(segment, 0)``, one client shared by the threads (as
  an fsspec filesystem is shared in a process);
- ``reference``: a Unix socket to ``fanout_reference`` announcing the segment, then
  ``recv`` until it closes: the same bytes with no HTTP, no store, no durability.

With ``trio`` one thread runs a trio task per follower (``followers_async``).

Every follower checks every line (``<seq> <monotonic ns of the append> <padding>``):
sequence numbers must arrive exactly once and in order from 0; the latency of each
line is the time from just before its append to the arrival of the piece holding it
(``time.monotonic_ns``, one clock for every process of the machine), counted in
``BUCKET_NS`` buckets; every ``K``-th follower also keeps each line's arrival time, so
the parent can tell the time after the append's acknowledgement. It answers ``{"ready": n, "waited_s": s, "errors": {...}}`` once
every follower has line 0 (or after ``ready_timeout_s``).

Request 2: ``{"last_seq": N, "deadline_s": S}``: it waits until every follower has line
``N`` (or ``S`` seconds pass) and answers the counts, the latency histogram, the
errors (the parent reads its CPU time from /proc). Follower threads are daemon threads: EOF ends it.
"""

from __future__ import annotations

import gc
import json
import socket
import sys
import threading
import time
from collections import Counter
from typing import Any

BUCKET_NS = 100_000  # latency histogram resolution: 0.1 ms
THREAD_STACK_BYTES = 256 << 10  # a follower thread needs little stack; a thousand of them
RECV_BYTES = 1 << 16
POLL_S = 0.05


class Follower:
    """One follower's checks: sequence, count, latency histogram, error; a sampled one
    also keeps each line's arrival time (``arrivals``: [seq, monotonic ns])."""

    def __init__(self, sampled: bool = False) -> None:
        self.arrivals: list[tuple[int, int]] | None = [] if sampled else None
        self.next_seq = 0
        self.lines = 0
        self.pieces = 0  # deliveries: the pieces that brought the lines
        self.disorder = 0  # lines that were not the next sequence number
        self.histogram: Counter[int] = Counter()
        self.error: str | None = None
        self._rest = b""

    def take(self, piece: bytes) -> None:
        now_ns = time.monotonic_ns()
        self.pieces += 1
        lines = (self._rest + piece).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            seq_text, sent_text, _ = line.split(b" ", 2)
            seq = int(seq_text)
            if seq != self.next_seq:
                self.disorder += 1
            self.next_seq = seq + 1
            self.lines += 1
            if seq > 0:  # line 0 is the warm-up every follower waits for
                self.histogram[(now_ns - int(sent_text)) // BUCKET_NS] += 1
                if self.arrivals is not None:
                    self.arrivals.append((seq, now_ns))


def follow_tierfs(client: Any, name: str, follower: Follower) -> None:
    try:
        for piece in client.follow(name, 0):
            follower.take(piece)
    except Exception as e:  # counted and reported: the benchmark's "errors"
        follower.error = f"{type(e).__name__}: {e}"


def follow_reference(path: str, segment_index: int, follower: Follower) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            sock.sendall(b"F %d\n" % segment_index)
            while piece := sock.recv(RECV_BYTES):
                follower.take(piece)
    except Exception as e:
        follower.error = f"{type(e).__name__}: {e}"


def wait_until(followers: list[Follower], seq: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if all(f.next_seq > seq or f.error for f in followers):
            break
        time.sleep(POLL_S)
    return time.monotonic() - started


def errors_of(followers: list[Follower]) -> dict[str, int]:
    # the message without the socket path, so equal errors count together
    return dict(Counter(f.error.split(" at ")[0] for f in followers if f.error))


def main() -> int:
    request = json.loads(sys.stdin.readline())
    threading.stack_size(THREAD_STACK_BYTES)
    sample_every = request["sample_every"]
    followers = [Follower(index % sample_every == 0) for index in range(len(request["followers"]))]
    threads = []
    if request["clients"] == "trio":
        from benchmarks.followers_async import run_followers

        threads.append(threading.Thread(target=run_followers, daemon=True, args=(
            request["source"], request["address"], request["segments"], request["followers"], followers,
            request["via"])))
    elif request["source"] == "tierfs":
        from tierfs.remote.client import TierClient

        client = TierClient(request["address"])
        for index, f in zip(request["followers"], followers, strict=True):
            threads.append(threading.Thread(target=follow_tierfs, args=(client, request["segments"][index], f),
                                            daemon=True))
    else:
        for index, f in zip(request["followers"], followers, strict=True):
            threads.append(threading.Thread(target=follow_reference, args=(request["address"], index, f),
                                            daemon=True))
    gc.collect()  # the process's setup stays out of the collector's full passes (pauses
    gc.freeze()  # of 15-40 ms that every follower of the process would wait out), and
    gc.set_threshold(50_000, 20, 100)  # young objects are collected rarely, as in the daemon
    for thread in threads:
        thread.start()
    waited_s = wait_until(followers, 0, request["ready_timeout_s"])
    answer(dict(ready=sum(f.next_seq > 0 for f in followers), waited_s=waited_s, errors=errors_of(followers)))
    line = sys.stdin.readline()
    if not line:
        return 0
    finish = json.loads(line)
    waited_s = wait_until(followers, finish["last_seq"], finish["deadline_s"])
    histogram: Counter[int] = Counter()
    for f in followers:
        histogram.update(f.histogram)
    answer(dict(
        followers=len(followers),
        complete=sum(f.lines == finish["last_seq"] + 1 and f.disorder == 0 and f.error is None for f in followers),
        lines=sum(f.lines for f in followers),
        pieces=sum(f.pieces for f in followers),
        disorder=sum(f.disorder for f in followers),
        errors=errors_of(followers),
        histogram={str(bucket): count for bucket, count in histogram.items()},
        drain_s=waited_s,
        samples=[[segment, seq, arrived_ns] for segment, f in zip(request["followers"], followers, strict=True)
                 if f.arrivals is not None for seq, arrived_ns in f.arrivals],
    ))
    return 0


def answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
