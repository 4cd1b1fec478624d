"""fsspec writes (issue 19 item 5), part of ``python -m benchmarks fsspec`` (alone with
``--writes-only``): ``tierfs://`` files written in ``wb`` and ``ab`` next to the engine
in-process appending the same bytes in the same append size, in the same run.

Per round (``--write-rounds``, 3), on the benchmark's daemon and its in-process store
(both PD; data dirs on the same disk), ``--write-mib`` (256) MiB of seeded bytes:

- (W) ceiling: a new file on the same disk, ``os.write`` of 8 MiB pieces each followed
  by ``fdatasync``: the disk's pace for durable writes of that size;
- (e) engine: ``store.create``, then ``store.append`` of 8 MiB pieces, in this process;
- (wb) ``fs.open("tierfs://<new>", "wb")``, ``f.write`` of 1 MiB pieces, ``close``, in a
  thread: the file sends each full 8 MiB buffer as one pipelined append;
- (ab) as (wb) with ``ab`` on a segment holding 4 KiB.

(W) first, then the cases in an order rotating from round to round, each timed from the
create or open to the last acknowledgement; before each, both stores flush everything
and ``sync`` runs (untimed). Per case: the appending process's CPU, its event loop's
thread on a CPU and waiting for one, the writing thread's, and the block device's busy
time and bytes written (every tenant's). Each fsspec segment is read back and its
SHA-256 compared. Target: (wb) / (e) and (ab) / (e) >= 0.7, medians of the rounds' ratios.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
from pathlib import Path
from time import perf_counter
from typing import Any, TextIO

import trio

from benchmarks.harness import procfs
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, spread
from benchmarks.harness.scenario import table

USER_WRITE_BYTES = MiB  # one f.write
AB_HEAD_BYTES = 4096
CASES = ("e", "wb", "ab")
LABELS = {"W": "(W) ceiling: os.write 8 MiB + fdatasync, same disk",
          "e": "(e) engine in-process, await store.append(8 MiB)",
          "wb": "(wb) tierfs:// wb, f.write(1 MiB), 8 MiB appends",
          "ab": "(ab) tierfs:// ab, f.write(1 MiB), 8 MiB appends"}


def _disk(directory: Path) -> tuple[int, int] | None:
    """(ms busy, 512-byte sectors written) of the block device holding ``directory``."""
    device = os.stat(directory).st_dev
    try:
        fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text().split()
    except OSError:
        return None
    return int(fields[9]), int(fields[6])


def _counters(directory: Path, daemon: Any) -> list[Any]:
    """What a case is charged with: (the appending process's CPU, its loop thread's
    schedstat, the writing thread's, the disk's counters); ``daemon`` None: (e)."""
    if daemon is None:
        return [procfs.self_cpu_s(), procfs.thread_times(), None, _disk(directory)]
    return [procfs.cpu_s(daemon.pid), procfs.thread_times(f"/proc/{daemon.pid}/task/{daemon.pid}/schedstat"),
            procfs.thread_times(), _disk(directory)]


@dataclasses.dataclass(frozen=True)
class WriteCase:
    throughput: Throughput
    process_cpu_s: float
    loop_s: list[float] | None  # the appending process's event loop: on a CPU, waiting for one
    writer_s: list[float] | None  # wb, ab: the writing thread, likewise
    disk_busy_s: float | None
    disk_written_bytes: int | None

    @classmethod
    def of(cls, throughput: Throughput, before: list[Any], after: list[Any]) -> WriteCase:
        def spent(i: int) -> list[float] | None:
            return None if before[i] is None or after[i] is None else [a - b for a, b in zip(after[i], before[i],
                                                                                             strict=True)]

        disk = spent(3)
        return cls(throughput, after[0] - before[0], spent(1), spent(2), disk[0] / 1000 if disk else None,
                   int(disk[1]) * 512 if disk else None)


def disk_ceiling(directory: Path, payload: bytes, piece_bytes: int) -> Throughput:
    path = directory / "write-ceiling.bin"
    view = memoryview(payload)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start_s = perf_counter()
        for offset in range(0, len(view), piece_bytes):
            piece = view[offset:offset + piece_bytes]
            while piece:
                piece = piece[os.write(fd, piece):]
            os.fdatasync(fd)
        seconds = perf_counter() - start_s
    finally:
        os.close(fd)
        path.unlink()
    return Throughput(LABELS["W"], len(payload), seconds)


async def engine_write(store: Any, directory: Path, name: str, payload: bytes, piece_bytes: int) -> WriteCase:
    from tierfs import SegmentInfo

    view, before = memoryview(payload), _counters(directory, None)
    start_s = perf_counter()
    await store.create(name, make_parents=True)
    for offset in range(0, len(view), piece_bytes):
        await store.append(name, view[offset:offset + piece_bytes])
    seconds, after = perf_counter() - start_s, _counters(directory, None)
    info = await store.stat(name)
    if not isinstance(info, SegmentInfo) or info.durable_length != len(payload):
        raise RuntimeError(f"the engine holds {getattr(info, 'durable_length', None)} of {len(payload)} bytes")
    return WriteCase.of(Throughput(LABELS["e"], len(payload), seconds), before, after)


def fsspec_write(fs: Any, daemon: Any, directory: Path, name: str, mode: str, payload: bytes) -> WriteCase:
    """(wb) or (ab) in this thread, then the segment read back and compared (untimed)."""
    head = bytes(range(256)) * (AB_HEAD_BYTES // 256) if mode == "ab" else b""
    if head:
        fs.pipe_file(name, head)
    view, before = memoryview(payload), _counters(directory, daemon)
    start_s = perf_counter()
    with fs.open(name, mode) as f:
        for offset in range(0, len(view), USER_WRITE_BYTES):
            f.write(view[offset:offset + USER_WRITE_BYTES])
    seconds, after = perf_counter() - start_s, _counters(directory, daemon)
    digest = hashlib.sha256()
    with fs.open(name, "rb") as f:
        while piece := f.read(4 * MiB):
            digest.update(piece)
    if digest.hexdigest() != hashlib.sha256(head + payload).hexdigest():
        raise RuntimeError(f"tierfs://{name} ({mode}) holds other bytes than were written")
    return WriteCase.of(Throughput(LABELS[mode], len(payload), seconds), before, after)


async def measure_writes(store: Any, daemon: Any, directory: Path, size: int, rounds: int,
                         log: TextIO) -> list[dict[str, Any]]:
    """The write rounds against ``daemon`` and the in-process ``store``: per round its
    order, (W) and the cases."""
    from tierfs.fsspec_impl.filesystem import WRITE_BUFFER_BYTES, TierFileSystem

    from tierfs.contracts import operations as ops

    payload = make_payload(size, seed=19)
    fs = TierFileSystem(url=daemon.url, skip_instance_cache=True)

    async def settle() -> None:
        await store.flush()
        await trio.to_thread.run_sync(lambda: fs.client.call(ops.FLUSH))
        await trio.to_thread.run_sync(os.sync)

    found = []
    try:
        for index in range(rounds):
            order = CASES[index % len(CASES):] + CASES[:index % len(CASES)]
            print(f"write round {index + 1}/{rounds}: {size // MiB} MiB, (W) then {', '.join(order)} ...", file=log,
                  flush=True)
            await settle()
            found.append({"order": order, "W": await trio.to_thread.run_sync(
                disk_ceiling, directory, payload, WRITE_BUFFER_BYTES)})
            for case in order:
                await settle()
                name = f"bench/write-{case}-{index}"
                found[-1][case] = (await engine_write(store, directory, name, payload, WRITE_BUFFER_BYTES)
                                   if case == "e" else await trio.to_thread.run_sync(
                                       fsspec_write, fs, daemon, directory, name, case, payload))
            await store.delete(f"bench/write-e-{index}")
            for case in ("wb", "ab"):
                await trio.to_thread.run_sync(fs.rm_file, f"bench/write-{case}-{index}")
    finally:
        fs.client.close()
    return found


def ratios_to_engine(rounds: list[dict[str, Any]], case: str) -> list[float]:
    return [r[case].throughput.mb_per_s / r["e"].throughput.mb_per_s for r in rounds]


def write_checks(rounds: list[dict[str, Any]]) -> list[Check]:
    return [Check.over(f"({case}) / (e) tierfs:// {case} vs engine", ratios_to_engine(rounds, case), 0.7, True)
            for case in ("wb", "ab")]


def format_writes(rounds: list[dict[str, Any]], size: int) -> list[str]:
    rows = [[LABELS["W"], *spread([r["W"] for r in rounds])]]
    rows += [[LABELS[case], *spread([r[case].throughput for r in rounds])] for case in CASES]
    lines = table([f"write {size // MiB} MiB, median of rounds", "MB/s", "min", "max"], rows)
    lines.append("per round: MB/s -> / (e) [wall; CPU of the appending process; its loop thread on a CPU, waiting for "
                 "one; the fsspec writer's; the disk's busy time and writes]")
    for index, r in enumerate(rounds, 1):
        lines.append(f"round {index} ({', '.join(r['order'])}): (W) {r['W'].mb_per_s:,.1f}")
        for case in CASES:
            c = r[case]
            parts = [f"{c.throughput.seconds:.2f} s", f"{'this process' if case == 'e' else 'daemon'} CPU "
                     f"{c.process_cpu_s:.2f}"]
            parts += [f"{what} {v[0]:.2f}/{v[1]:.2f}" for what, v in (("loop", c.loop_s), ("writer", c.writer_s)) if v]
            if c.disk_busy_s is not None:
                parts.append(f"disk busy {c.disk_busy_s:.2f}, {c.disk_written_bytes / MiB:,.0f} MiB")
            ratio = "" if case == "e" else f" -> {c.throughput.mb_per_s / r['e'].throughput.mb_per_s:.3f}"
            lines.append(f"  ({case}) {c.throughput.mb_per_s:,.1f}{ratio} [{'; '.join(parts)}]")
    engine_disk = statistics.median(r["e"].throughput.mb_per_s / r["W"].mb_per_s for r in rounds)
    lines.append(f"(e) / (W) median {engine_disk:.3f} (the engine against the disk's pace for PD appends this size)")
    return lines
