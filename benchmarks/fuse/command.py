"""FUSE benchmark: ``dd bs=1M`` through a tierfs mount next to the ceilings of this machine.

Needs /dev/fuse, fusermount3 and Node.js (s3rver). A tierfs mount daemon (``tierfs
mount``, no ``-v``, ``TIERFS_*`` left out; tier-2 ``s3://tierfs-bench/chunks`` on s3rver,
``durability = "vd"``, a block cache of 1.25 x the segment) gets ``--rounds`` (3)
segments of ``--size-mib`` (256) MiB through its API, flushed. Beside it the minimal
pyfuse3 filesystem (``harness.minimal_fs``, the same ``FileInfo`` options) serves
``data`` from memory, discards writes to ``sink`` and passes writes to ``journal`` on to
a file on the data disk. Per mode, ``direct_io`` (the default) and ``page_cache``, with
the daemon started afresh, per round: the ceilings' ``dd`` (read ``data``, write
``sink`` and ``journal``); in direct_io s3fs ``cat_file`` of the segment's objects and the
read-ahead bound, seconds before the cold read; ``dd`` of the segment cold (GETs from the
daemon's metrics, CPU of s3rver and the daemon) and warm; a VD write burst; in direct_io
the sustained VD write of ``--sustained-mib`` (``sustained.py``). Every timed write
starts after an untimed ``sync(2)``; throughput is dd's own figure.

Targets (issue 5, 19), direct_io: warm read >= 0.5 x the ceiling's read (medians);
sustained VD write >= 0.9 x ``write(2)`` per request and cold read >= 1.0 x s3fs
``cat_file`` measured seconds before it (medians of the rounds' ratios); GETs of a cold
read <= bytes / 1 MiB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, TextIO

from benchmarks.fuse.sustained import SustainedRound, format_sustained, sustained_round
from benchmarks.harness import procfs, s3
from benchmarks.harness.figures import (
    Check,
    MiB,
    Throughput,
    make_payload,
    ratios,
    warm_cache_bytes,
)
from benchmarks.harness.fuse import BenchError, MountProcess, dd, dd_write, require
from benchmarks.harness.scenario import (
    Report,
    add_size_rounds_arguments,
    at_least_one,
    run_scenario,
    table,
)
from benchmarks.harness.stores import write_via_client

HELP = "dd bs=1M through a tierfs mount (cold from S3, warm, VD write) vs a minimal pyfuse3 filesystem and raw s3fs"
MODES = ("direct_io", "page_cache")
ROWS = {"ceiling_read": "ceiling: minimal pyfuse3, read from memory",
        "ceiling_sink": "ceiling: minimal pyfuse3, discarding write",
        "ceiling_journal": "ceiling: minimal pyfuse3, write(2) to disk",
        "cold": "tierfs cold read (chunks in S3)", "warm": "tierfs warm read (block cache)",
        "vd_write": "tierfs VD write burst, upload after (dd)", "cat_file": "raw s3fs cat_file, same chunk objects",
        "bound": "bound: raw s3fs, read-ahead GET size/conc."}
START_TIMEOUT_S = 60.0  # a mount whose tier-2 is s3rver, on a loaded machine
STOP_TIMEOUT_S = 120.0  # unmounting flushes the last VD writes to S3


def measure_mode(directory: Path, mode: str, endpoint: s3.S3Endpoint, args: argparse.Namespace,
                 layouts: list[s3.Layout], log: TextIO) -> tuple[dict[str, list[Any]], list[SustainedRound]]:
    from tierfs.testing.harness import Mount

    size_mib, options = args.size_mib, endpoint.storage_options()
    found: dict[str, list[Any]] = {key: [] for key in [*ROWS, "gets", "cpu"]}
    sustained: list[SustainedRound] = []
    direct = ["--direct-io"] if mode == "direct_io" else []
    ceiling = MountProcess.minimal(directory / "ceiling-mnt", directory / "ceiling.log",
                                   "--data-bytes", str(size_mib * MiB), "--journal-dir", str(directory), *direct)
    try:
        mount = Mount(directory / "data", directory / "mnt", *([] if direct else ["--page-cache"]),
                      config_file=directory / "tierfs.toml", env=endpoint.environment(), drop_tierfs_env=True,
                      log_path=directory / f"tierfs-{mode}.log", verbose=False, timeout_s=START_TIMEOUT_S)
        try:
            if not layouts:
                print(f"writing {args.rounds} x {size_mib} MiB and flushing them to S3 ...", file=log, flush=True)
                client = mount.client()
                layouts += [write_via_client(client, f"cold-{r}", make_payload(size_mib * MiB, 5 + r), durability="pd")
                            for r in range(args.rounds)]
                client.close()
            for r, layout in enumerate(layouts):
                print(f"[{mode}] round {r + 1}/{args.rounds}: ceilings, cold and warm read, VD write ...", file=log,
                      flush=True)
                found["ceiling_read"].append(dd(ceiling.mountpoint / "data", "/dev/null"))
                found["ceiling_sink"].append(dd_write(ceiling.mountpoint / "sink", size_mib))
                found["ceiling_journal"].append(dd_write(ceiling.mountpoint / "journal", size_mib))
                os.sync()  # untimed: the journal file's writeback is not the cold read's
                if direct:
                    found["cat_file"].append(s3.cat_file_ceiling(options, layout))
                    found["bound"].append(s3.readahead_ceiling(options, layout))
                gets = mount.metrics()["tierfs_tier2_gets_total"]
                daemon_s, server_s = procfs.cpu_s(mount.pid), procfs.cpu_s(endpoint.pid)
                found["cold"].append(dd(mount.path(f"cold-{r}"), "/dev/null"))
                found["cpu"].append((procfs.cpu_s(endpoint.pid) - server_s, procfs.cpu_s(mount.pid) - daemon_s))
                found["gets"].append(int(mount.metrics()["tierfs_tier2_gets_total"] - gets))
                found["warm"].append(dd(mount.path(f"cold-{r}"), "/dev/null"))
            client = mount.client()
            for r in range(args.rounds):
                found["vd_write"].append(dd_write(mount.path(f"vd-{mode}-{r}"), size_mib))
                client.op("flush")  # untimed: the next round starts with no backlog
            client.close()
            for r in range(args.rounds if direct else 0):
                print(f"[{mode}] round {r + 1}/{args.rounds}: sustained VD write of {args.sustained_mib} MiB ...",
                      file=log, flush=True)
                sustained.append(sustained_round(ceiling.mountpoint / "journal", mount, f"sustained-{r}",
                                                 args.sustained_mib * MiB, endpoint))
        finally:
            code, _ = mount.unmount(timeout_s=STOP_TIMEOUT_S)
            if code != 0:
                print(f"the tierfs mount exited with {code}:\n{mount.stderr_tail()}", file=log, flush=True)
    finally:
        ceiling.unmount()
    return found, sustained


def measure(directory: Path, args: argparse.Namespace) -> Report:
    at_least_one(args, "size_mib", "rounds", "sustained_mib")
    require("fusermount3", "dd")
    log = sys.stderr
    with s3.s3_server(directory / "s3", log) as endpoint:
        (directory / "tierfs.toml").write_text(
            f'tier2_url = "s3://{s3.BUCKET}/chunks"\ntier2_endpoint_url = "{endpoint.url}"\n'
            f'durability = "vd"\nblock_cache_bytes = {warm_cache_bytes(args.size_mib * MiB)}\n')
        layouts: list[s3.Layout] = []
        modes, sustained = {}, []
        for mode in MODES:
            modes[mode], found = measure_mode(directory, mode, endpoint, args, layouts, log)
            sustained += found
        print("raw s3fs 1 MiB cat_ranges of the same chunks; raw dd to the disk ...", file=log, flush=True)
        ranges = [s3.cat_ranges_ceiling(endpoint.storage_options(), layout, MiB, 16) for layout in layouts]
    disk = []
    for r in range(args.rounds):
        disk.append(dd_write(directory / f"raw-{r}", args.size_mib))
        (directory / f"raw-{r}").unlink()
    return report(args, len(layouts[0]), modes, sustained, ranges, disk)


def report(args: argparse.Namespace, chunks: int, modes: dict[str, dict[str, list[Any]]],
           sustained: list[SustainedRound], ranges: list[Throughput], disk: list[Throughput]) -> Report:
    def median(figures: list[Throughput]) -> float:
        return statistics.median(f.mb_per_s for f in figures)

    rows = [[label, *(median(modes[mode][key]) if modes[mode][key] else "-" for mode in MODES)]
            for key, label in ROWS.items()]
    rows += [["raw s3fs 1 MiB ranged GETs, 16 in flight", median(ranges), "-"],
             ["raw dd write to a file on the data disk", median(disk), "-"]]
    lines = []
    for mode in MODES:
        m = modes[mode]
        lines.append(f"{mode}: warm/ceiling {median(m['warm']) / median(m['ceiling_read']):.3f}, write/ceiling "
                     f"{median(m['vd_write']) / median(m['ceiling_sink']):.3f}, write/journal ceiling "
                     f"{median(m['vd_write']) / median(m['ceiling_journal']):.3f}, cold/1 MiB GETs "
                     f"{median(m['cold']) / median(ranges):.3f}, write/raw disk {median(m['vd_write']) / median(disk):.3f}"
                     f"; GETs per cold read {m['gets']} for {args.size_mib} blocks; CPU s s3rver/tierfs daemon per "
                     f"cold read: " + ", ".join(f"{server:.2f}/{daemon:.2f}" for server, daemon in m["cpu"]))
    d = modes["direct_io"]
    lines.append("direct_io rounds (raw and bound seconds before each cold read): " + "; ".join(
        f"cold {c.mb_per_s:,.1f} raw {w.mb_per_s:,.1f} bound {b.mb_per_s:,.1f}"
        for c, w, b in zip(d["cold"], d["cat_file"], d["bound"], strict=True)))
    lines.append(f"bound / raw cat_file {median(d['bound']) / median(d['cat_file']):.3f}; cold read / bound "
                 f"{median(d['cold']) / median(d['bound']):.3f}")
    # the ceiling's reads pair with no particular warm read: the ratio of the medians
    checks = [Check("warm read / ceiling read", median(d["warm"]) / median(d["ceiling_read"]), 0.5, True, "x"),
              Check.over("sustained VD write / write(2)", [r.ratio for r in sustained], 0.9, True),
              Check.over("cold read / raw s3fs cat_file", ratios(d["cold"], d["cat_file"]), 1.0, True),
              Check("cold read GETs / (bytes / 1 MiB)", max(d["gets"]) / args.size_mib, 1.0, False, "x")]
    title = (f"FUSE benchmark: {args.size_mib} MiB segments ({chunks} chunks each in s3rver); dd bs=1M; MB/s, medians "
             f"of {args.rounds} rounds")
    return Report(title, [table(["measurement", *MODES], rows), lines, format_sustained(sustained)], checks,
                  {"modes": modes, "sustained": sustained, "raw_cat_ranges": ranges, "raw_disk_write": disk})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tierfs import StoreConfig

    default_mib = 2 * StoreConfig().max_backlog_bytes // MiB
    parser.add_argument("--sustained-mib", type=int, default=default_mib,
                        help=f"bytes per sustained VD write, MiB (default {default_mib}: twice the flush backlog)")
    add_size_rounds_arguments(parser, 256, 3, "data dir, S3 server data, mount points")


def run(args: argparse.Namespace) -> int:
    return run_scenario("fuse", args, lambda directory: measure(directory, args), errors=(BenchError, RuntimeError,
                                                                                            OSError))
