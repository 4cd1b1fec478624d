"""FUSE benchmark: ``dd bs=1M`` through a tierfs mount next to the ceilings of this machine.

One run, in a fresh scratch directory ``tmp-tierfs-bench-*`` under ``--dir`` (default:
the current directory; RAM filesystems are refused), removed at the end. Needs
/dev/fuse, fusermount3 and Node.js (s3rver, installed from ``benchmarks/package.json``).

Set-up. s3rver (npm, see ``s3server.py``; not moto, which slows down on large objects)
on 127.0.0.1 with a bucket. ``--rounds`` (default 3) segments ``cold-<r>`` of
``--size-mib`` MiB (default 256) of seeded random bytes are appended through the API of
a tierfs mount daemon (``python -m tierfs.cli --data-dir D --config F mount M
--foreground``, started by the shared harness ``tierfs.testing.harness.Mount`` without
``-v`` and without ``TIERFS_*`` variables; the TOML file sets ``tier2_url = s3://bucket/chunks``, the endpoint,
``durability = "vd"`` and a block cache of 1.25 x the segment) and flushed, so their
chunks are S3 objects. Then for each mode, ``direct_io`` (the default of ``tierfs
mount``) and ``page_cache`` (``--page-cache``):

- ceiling: ``python -m benchmarks.fuse_ceiling`` mounts a minimal pyfuse3 filesystem
  (same ``FileInfo`` options) serving ``data`` from memory, discarding writes to
  ``sink`` and passing writes to ``journal`` on to a file on the data disk with one
  ``write(2)`` each; per round ``dd if=data of=/dev/null bs=1M``, ``dd if=/dev/zero
  of=sink bs=1M count=<size>`` and the same into ``journal``;
- tierfs: the mount daemon is started afresh (empty block cache), then per round
  ``dd if=cold-<r> bs=1M`` (cold: every block is a ranged GET to S3; the daemon's
  ``tierfs_tier2_gets_total`` before/after gives the GETs) and again (warm: the block
  cache holds it); then per round ``dd if=/dev/zero of=vd-<mode>-<r> bs=1M
  count=<size>`` (a new VD segment), each followed by an untimed flush of everything
  to S3, so no round's background upload overlaps the next measurement;
- raw, in the direct_io rounds seconds before each cold read: s3fs ``cat_file`` of each
  chunk object of ``cold-<r>``, whole, one after another (fresh s3fs instance, its
  client set up by one untimed HEAD): what reading those objects costs without tierfs;
  and the bound: s3fs ``cat_ranges`` of the same bytes with the request size and
  concurrency of tierfs's read-ahead at full window (``read_bounds.raw_runs``: 16 MiB
  ranges, 2 in flight): s3rver's own throughput for tierfs's requests;
- sustained VD write, in the direct_io mode, ``--rounds`` times (``benchmarks/fuse_writes.py``):
  ``--sustained-mib`` (default twice ``max_backlog_bytes``, 2 GiB) written with one
  1 MiB ``os.write`` per request into a new segment, a request refused because the
  backlog is full (ENOSPC) retried after 10 ms, timed until ``client.op("flush")``
  returns (the upload included); seconds before it, the same writer into the minimal
  filesystem's ``journal`` file (one ``write(2)`` per request to the data disk, mounted
  again beside tierfs) and the upload bound (s3fs ``pipe_file`` of 16 MiB objects one
  after another, as the storage writer flushes one segment);
- at the end: s3fs ``cat_ranges`` of the same bytes as 1 MiB ranges, 16 in flight
  (what one GET per 1 MiB block costs on this server without tierfs) and ``dd
  if=/dev/zero of=<scratch>/raw-<r> bs=1M`` (no sync, like a VD write): what writing
  the bytes once to the data dir's disk costs.

Every timed write starts after an untimed ``sync(2)``, so no measurement pays for the
writeback of what an earlier step left dirty.

Throughput is dd's own figure (bytes / its elapsed seconds). Each row is the median of
the rounds; the ratios are computed from the medians, except cold read / raw
``cat_file``: the median of each round's own ratio (the two are measured seconds apart,
on a machine whose load moves a lot).

Around every cold read the CPU seconds of s3rver (its node process) and of the tierfs
mount daemon are recorded, and the daemon's GETs against bytes / 1 MiB.

Targets (issue 5, issue 19), in the default mode (direct_io): warm read >= 0.5 x the
ceiling's read; sustained VD write >= 0.9 x the ceiling's one ``write(2)`` per request
(median of the rounds' own ratios; issue 19 item 7 replaced the 256 MiB ``dd`` burst
against the discarding write, which stops the clock before the upload); cold read >=
1.0 x raw s3fs ``cat_file`` of the same chunks; GETs of a cold read <= bytes / 1 MiB. A
missed target is reported, not an error. More ratios show what the machine allows for
the work tierfs must do: sustained write / the upload bound, the burst / the ceiling's
``journal`` write, and cold read / raw 1 MiB ranged GETs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from benchmarks.common import (
    EXIT_USAGE,
    Check,
    MiB,
    Throughput,
    add_size_rounds_arguments,
    checks_json,
    format_checks,
    make_payload,
    run_size_rounds,
    warm_cache_bytes,
)
from benchmarks.fuse_tools import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BenchError,
    CeilingMount,
    dd,
    dd_write,
)
from benchmarks.fuse_writes import SustainedRound, format_sustained, sustained_writes
from tierfs.testing.harness import Mount

if TYPE_CHECKING:
    from benchmarks.read_bounds import CpuUse
    from tierfs.remote.client import TierClient

HELP = "dd bs=1M through a tierfs mount (cold from S3, warm, VD write) vs a minimal pyfuse3 filesystem and raw s3fs"

MODES = ("direct_io", "page_cache")
DEFAULT_MODE = "direct_io"
BUCKET = "tierfs-bench"
SEED = 5
WRITE_PIECE_BYTES = 4 * MiB
WARM_TARGET = 0.5
SUSTAINED_TARGET = 0.9
COLD_TARGET = 1.0


def start_tierfs_mount(data_dir: Path, config: Path, mountpoint: Path, mode: str,
                       env: dict[str, str], log: Path) -> Mount:
    """``tierfs mount`` through the shared harness, in ``mode``, without ``-v`` (logging
    would be measured), ``TIERFS_*`` variables left out (only ``config`` applies)."""
    args = ["--page-cache"] if mode == "page_cache" else []
    return Mount(data_dir, mountpoint, *args, config_file=config, env=env, drop_tierfs_env=True,
                 log_path=log, verbose=False, timeout_s=START_TIMEOUT_S)


def tier2_gets(mount: Mount) -> int:
    return int(mount.metrics()["tierfs_tier2_gets_total"])


def stop_tierfs_mount(mount: Mount, client: TierClient, log: TextIO) -> None:
    client.close()
    code, _ = mount.unmount(timeout_s=STOP_TIMEOUT_S)
    if code != 0:
        print(f"the tierfs mount exited with {code}:\n{mount.stderr_tail()}", file=log, flush=True)


# ----------------------------------------------------------------------- figures
@dataclasses.dataclass(frozen=True)
class ModeResult:
    mode: str
    ceiling_read: list[Throughput]
    ceiling_write: list[Throughput]
    ceiling_journal_write: list[Throughput]
    cold_read: list[Throughput]
    warm_read: list[Throughput]
    vd_write: list[Throughput]
    cold_gets: list[int]
    cold_cpu: list[CpuUse]  # s3rver's and the mount daemon's CPU seconds per cold read

    @staticmethod
    def median(values: list[Throughput]) -> float:
        return statistics.median(t.mb_per_s for t in values)


@dataclasses.dataclass(frozen=True)
class Results:
    size_bytes: int
    chunks_per_segment: int
    raw_cat_file: list[Throughput]
    raw_cat_ranges: list[Throughput]
    raw_runs: list[Throughput]  # the bound: read-ahead's request size and concurrency
    raw_cpu: dict[str, list[CpuUse]]  # s3rver's and this process's CPU: cat_file, runs
    raw_disk_write: list[Throughput]
    modes: dict[str, ModeResult]
    sustained: list[SustainedRound]  # direct_io


@dataclasses.dataclass(frozen=True)
class Options:
    size: int
    rounds: int
    sustained_bytes: int


def measure(directory: Path, opts: Options, log: TextIO) -> Results:
    for tool in ("fusermount3", "dd"):
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} is not installed")
    if not os.path.exists("/dev/fuse"):
        raise BenchError("/dev/fuse is missing")
    from benchmarks.read import new_s3fs, raw_cat_file, raw_cat_ranges
    from benchmarks.read_bounds import (
        measured,
        process_cpu_of,
        raw_runs,
        readahead_requests,
        s3rver_pid,
    )
    from benchmarks.s3server import s3_server
    from tierfs.contracts.config import StoreConfig

    size_mib = opts.size // MiB
    with s3_server(directory / "s3", log) as endpoint:
        endpoint.create_bucket(BUCKET)
        config = directory / "tierfs.toml"
        config.write_text(
            f'tier2_url = "s3://{BUCKET}/chunks"\n'
            f'tier2_endpoint_url = "{endpoint.url}"\n'
            f'durability = "vd"\n'
            f"block_cache_bytes = {warm_cache_bytes(opts.size)}\n"
        )
        server_pid = s3rver_pid(directory / "s3")
        env = {"AWS_ACCESS_KEY_ID": endpoint.key, "AWS_SECRET_ACCESS_KEY": endpoint.secret,
               "AWS_DEFAULT_REGION": "us-east-1"}
        data_dir, mnt = directory / "data", directory / "mnt"
        options = endpoint.storage_options()
        run_bytes, in_flight = readahead_requests(StoreConfig().readahead_max_bytes)
        raw: list[Throughput] = []
        runs: list[Throughput] = []
        raw_cpu: dict[str, list[CpuUse]] = {"cat_file": [], "bound": []}
        layouts: list[list[dict[str, Any]]] = []
        modes: dict[str, ModeResult] = {}
        sustained: list[SustainedRound] = []
        for mode in MODES:
            print(f"[{mode}] ceiling: minimal pyfuse3 filesystem ...", file=log, flush=True)
            ceiling = CeilingMount(directory / "ceiling-mnt", opts.size, mode, directory / "ceiling.log",
                                   journal_dir=directory)
            try:
                ceiling_read = [dd(ceiling.mountpoint / "data", "/dev/null") for _ in range(opts.rounds)]
                ceiling_write = [dd_write(ceiling.mountpoint / "sink", size_mib)
                                 for _ in range(opts.rounds)]
                ceiling_journal_write = [dd_write(ceiling.mountpoint / "journal", size_mib)
                                         for _ in range(opts.rounds)]
            finally:
                ceiling.close()
            mount = start_tierfs_mount(data_dir, config, mnt, mode, env, directory / f"tierfs-{mode}.log")
            client = mount.client()
            try:
                if not layouts:
                    print(f"writing {opts.rounds} x {size_mib} MiB and flushing them to S3 ...",
                          file=log, flush=True)
                    layouts = [write_cold_segment(client, r, opts.size) for r in range(opts.rounds)]
                cold, warm, writes, gets, cold_cpu = [], [], [], [], []
                for r in range(opts.rounds):
                    print(f"[{mode}] round {r + 1}/{opts.rounds}: cold and warm read ...",
                          file=log, flush=True)
                    if mode == DEFAULT_MODE:  # the ceilings seconds before the cold read
                        whole, use = measured(server_pid, functools.partial(
                            raw_cat_file, options, layouts[r], new_s3fs(options, layouts[r][0]["url"])))
                        raw.append(whole)
                        raw_cpu["cat_file"].append(use)
                        bound, use = measured(server_pid, functools.partial(
                            raw_runs, options, layouts[r], run_bytes, in_flight,
                            new_s3fs(options, layouts[r][0]["url"])))
                        runs.append(bound)
                        raw_cpu["bound"].append(use)
                    before = tier2_gets(mount)
                    daemon_before_s = process_cpu_of(mount.pid)
                    read, use = measured(server_pid, functools.partial(dd, mnt / f"cold-{r}", "/dev/null"))
                    use = dataclasses.replace(use, client_s=process_cpu_of(mount.pid) - daemon_before_s)
                    cold.append(read)
                    cold_cpu.append(use)
                    gets.append(tier2_gets(mount) - before)
                    warm.append(dd(mnt / f"cold-{r}", "/dev/null"))
                for r in range(opts.rounds):
                    print(f"[{mode}] round {r + 1}/{opts.rounds}: VD write ...", file=log, flush=True)
                    writes.append(dd_write(mnt / f"vd-{mode}-{r}", size_mib))
                    client.op("flush")  # untimed: the next round starts with no backlog
                if mode == DEFAULT_MODE:
                    cpu_of = functools.partial(daemon_and_server_cpu_s, mount.pid, server_pid)
                    sustained = sustained_writes(directory, mnt, opts.rounds, opts.sustained_bytes, client,
                                                 options, BUCKET, cpu_of, log)
            finally:
                stop_tierfs_mount(mount, client, log)
            modes[mode] = ModeResult(mode, ceiling_read, ceiling_write, ceiling_journal_write, cold, warm,
                                     writes, gets, cold_cpu)
        print("raw s3fs 1 MiB cat_ranges of the same chunks; raw dd to the disk ...",
              file=log, flush=True)
        ranges = [raw_cat_ranges(options, layout) for layout in layouts]
        disk = []
        for r in range(opts.rounds):
            disk.append(dd_write(directory / f"raw-{r}", size_mib))
            (directory / f"raw-{r}").unlink()
    return Results(opts.size, len(layouts[0]), raw, ranges, runs, raw_cpu, disk, modes, sustained)


def daemon_and_server_cpu_s(daemon_pid: int, server_pid: int | None) -> tuple[float, float]:
    from benchmarks.read_bounds import process_cpu_of

    return process_cpu_of(daemon_pid), process_cpu_of(server_pid)


def write_cold_segment(client: TierClient, index: int, size: int) -> list[dict[str, Any]]:
    name = f"cold-{index}"
    payload = make_payload(size, SEED + index)
    client.create(name, durability="pd")
    for offset in range(0, size, WRITE_PIECE_BYTES):
        client.append(name, payload[offset : offset + WRITE_PIECE_BYTES], offset)
    client.op("flush", path=name)
    layout = client.layout(name)
    if sum(c["end"] - c["start"] for c in layout) != size:
        raise BenchError(f"{name} was not flushed completely")
    return layout


# ----------------------------------------------------------------------- report
def cold_versus_raw(r: Results) -> float:
    """Median over rounds of direct_io cold read / raw cat_file measured just before it."""
    cold = r.modes[DEFAULT_MODE].cold_read
    return statistics.median(c.mb_per_s / w.mb_per_s for c, w in zip(cold, r.raw_cat_file, strict=True))


def evaluate_targets(r: Results) -> list[Check]:
    m = r.modes[DEFAULT_MODE]
    return [
        Check("warm read / ceiling read", m.median(m.warm_read) / m.median(m.ceiling_read), WARM_TARGET, True, "x"),
        Check("sustained VD write / write(2)", statistics.median(x.ratio for x in r.sustained),
              SUSTAINED_TARGET, True, "x"),
        Check("cold read / raw s3fs cat_file", cold_versus_raw(r), COLD_TARGET, True, "x"),
        Check("cold read GETs / (bytes / 1 MiB)", max(m.cold_gets) / (r.size_bytes / MiB), 1.0, False, "x"),
    ]


def print_report(machine: dict[str, Any], r: Results, checks: list[Check], out: TextIO) -> None:
    fs = machine["filesystem"]
    print(f"FUSE benchmark: {r.size_bytes // MiB} MiB segments ({r.chunks_per_segment} chunks each in "
          f"s3rver); dd bs=1M; {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']}", file=out)
    print(f"medians of {len(r.raw_cat_file)} rounds, MB/s", file=out)
    print(file=out)
    header = f"{'measurement':<44} " + " ".join(f"{mode:>12}" for mode in MODES)
    print(header, file=out)
    print("-" * len(header), file=out)
    rows = (
        ("ceiling: minimal pyfuse3, read from memory", "ceiling_read"),
        ("ceiling: minimal pyfuse3, discarding write", "ceiling_write"),
        ("ceiling: minimal pyfuse3, write(2) to disk", "ceiling_journal_write"),
        ("tierfs cold read (chunks in S3)", "cold_read"),
        ("tierfs warm read (block cache)", "warm_read"),
        ("tierfs VD write burst, upload after (dd)", "vd_write"),
    )
    for label, field in rows:
        values = [ModeResult.median(getattr(r.modes[mode], field)) for mode in MODES]
        print(f"{label:<44} " + " ".join(f"{v:>12,.1f}" for v in values), file=out)
    raw = ModeResult.median(r.raw_cat_file)
    print(f"{'raw s3fs cat_file, same chunk objects':<44} {raw:>12,.1f}", file=out)
    ranges = ModeResult.median(r.raw_cat_ranges)
    print(f"{'raw s3fs 1 MiB ranged GETs, 16 in flight':<44} {ranges:>12,.1f}", file=out)
    bound = ModeResult.median(r.raw_runs)
    print(f"{'bound: raw s3fs, read-ahead GET size/conc.':<44} {bound:>12,.1f}", file=out)
    disk = ModeResult.median(r.raw_disk_write)
    print(f"{'raw dd write to a file on the data disk':<44} {disk:>12,.1f}", file=out)
    print(file=out)
    blocks = r.size_bytes // MiB
    for mode in MODES:
        m = r.modes[mode]
        print(f"{mode}: warm/ceiling {m.median(m.warm_read) / m.median(m.ceiling_read):.3f}, "
              f"write/ceiling {m.median(m.vd_write) / m.median(m.ceiling_write):.3f}, "
              f"write/journal ceiling {m.median(m.vd_write) / m.median(m.ceiling_journal_write):.3f}, "
              f"cold/raw {m.median(m.cold_read) / raw:.3f}, cold/1 MiB GETs "
              f"{m.median(m.cold_read) / ranges:.3f}, write/raw disk "
              f"{m.median(m.vd_write) / disk:.3f}; GETs per cold read {m.cold_gets} "
              f"for {blocks} blocks", file=out)
        cpu = ", ".join(f"{u.server_s:.2f}/{u.client_s:.2f}" for u in m.cold_cpu)
        print(f"  {mode} cold reads, CPU s s3rver/tierfs daemon: {cpu}", file=out)
    for label, uses in r.raw_cpu.items():
        cpu = ", ".join(f"{u.server_s:.2f}/{u.client_s:.2f}" for u in uses)
        print(f"  raw {label}, CPU s s3rver/client: {cpu}", file=out)
    cold = r.modes[DEFAULT_MODE].cold_read
    rounds = "; ".join(f"cold {c.mb_per_s:,.1f} raw {w.mb_per_s:,.1f} bound {b.mb_per_s:,.1f}"
                       for c, w, b in zip(cold, r.raw_cat_file, r.raw_runs, strict=True))
    print(f"{DEFAULT_MODE} rounds (raw and bound measured seconds before each cold read): {rounds}", file=out)
    print(f"bound / raw cat_file {bound / raw:.3f}; cold read / bound "
          f"{ModeResult.median(cold) / bound:.3f}; cold / raw, median of rounds {cold_versus_raw(r):.3f}",
          file=out)
    print(file=out)
    for line in format_sustained(r.sustained):
        print(line, file=out)
    print(file=out)
    for line in format_checks(checks):
        print(line, file=out)


def report_json(machine: dict[str, Any], r: Results, checks: list[Check]) -> dict[str, Any]:
    return {
        "benchmark": "fuse",
        "machine": machine,
        "results": dataclasses.asdict(r),
        "targets": checks_json(checks),
    }


# ------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tierfs.contracts.config import StoreConfig

    default_mib = 2 * StoreConfig().max_backlog_bytes // MiB
    parser.add_argument("--sustained-mib", type=int, default=default_mib,
                        help=f"bytes per sustained VD write, MiB (default {default_mib}: twice the flush backlog)")
    add_size_rounds_arguments(parser, 256, 3, "data dir, S3 server data, mount points")


def run(args: argparse.Namespace) -> int:
    if args.sustained_mib < 1:
        print("--sustained-mib must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    return run_size_rounds(
        "fuse", args, lambda directory, size, rounds: measure(
            directory, Options(size, rounds, args.sustained_mib * MiB), sys.stderr),
        evaluate_targets, print_report, report_json, errors=(BenchError, RuntimeError),
    )


if __name__ == "__main__":
    print(json.dumps({"error": "run as: python -m benchmarks fuse"}))
    sys.exit(EXIT_USAGE)
