"""FUSE benchmark: ``dd bs=1M`` through a tierfs mount next to the ceilings of this machine.

A tierfs mount (tier-2 on s3rver, ``durability = "vd"``, a block cache of 1.25 x the
segment) gets ``--rounds`` (3) segments of ``--size-mib`` (256) MiB through its API,
flushed. Beside it the minimal pyfuse3 filesystem (``harness.minimal_fs``, the same
``FileInfo`` options) serves ``data`` from memory, discards writes to ``sink`` and passes
writes to ``journal`` on to a file on the data disk. Per mode, ``direct_io`` (default)
and ``page_cache``, the daemon started afresh, per round: the ceilings' ``dd``; in
direct_io s3fs ``cat_file`` of the segment's objects and the read-ahead bound, seconds
before the cold read; ``dd`` of the segment cold (GETs, CPU of s3rver and the daemon) and
warm; a VD write burst; in direct_io the sustained VD write of ``--sustained-mib``. Then
s3fs 1 MiB ranges of each segment and a ``dd`` to the disk. Timed writes start after an
untimed ``sync(2)``; throughput is dd's own figure.

Sustained VD write (issue 19, item 7): once the flush backlog is full the mount refuses
appends (ENOSPC) until flushes make room, so a writer that keeps writing is bounded by
the upload. Per round: the ceiling, 1 MiB ``os.write`` requests into the minimal
filesystem's ``journal`` (what tierfs's VD does before it acknowledges); the upload
bound, s3fs ``pipe_file`` of 16 MiB (``max_flush_bytes``) objects one after another;
tierfs, the same writer into a new segment, a refused request (it wrote nothing) retried
after 10 ms, timed until every byte is in tier-2 (checked).

Targets (issue 5, 19), direct_io: warm read >= 0.5 x the ceiling's read (medians);
sustained VD write >= 0.9 x ``write(2)`` per request and cold read >= 1.0 x s3fs
``cat_file`` (medians of the rounds' ratios); GETs of a cold read <= bytes / 1 MiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from time import perf_counter, sleep
from typing import Any

from benchmarks.harness import procfs, s3
from benchmarks.harness.figures import Check, MiB, Throughput, make_payload, ratios
from benchmarks.harness.mounts import MountProcess, dd, dd_write, mounted, require, s3_tier2
from benchmarks.harness.scenario import Report, positive, rounds_table, say, size_rounds
from benchmarks.harness.stores import warm_cache_bytes, write_via_client
from tierfs import SegmentInfo, StoreConfig

HELP = "dd bs=1M through a tierfs mount (cold from S3, warm, VD write) vs a minimal pyfuse3 filesystem and raw s3fs"
MODES = ("direct_io", "page_cache")
LEGEND = {"ceiling": "minimal pyfuse3, read from memory", "sink": "minimal pyfuse3, discarding write",
          "journal": "minimal pyfuse3, write(2) to disk", "cold": "tierfs cold read (chunks in S3)",
          "warm": "tierfs warm read (block cache)", "burst": "tierfs VD write burst, upload after (dd)",
          "cat_file": "raw s3fs cat_file, same chunk objects", "bound": "raw s3fs, read-ahead GET size/conc."}
REQUEST_BYTES = MiB  # one FUSE write per request under direct_io, as dd bs=1M
# While requests are refused the backlog is full, so the wait costs the upload nothing;
# each refusal is a round trip the daemon answers on the CPUs the upload needs: 10 ms.
REFUSAL_WAIT_S = 0.01
UPLOAD_BOUND_BYTES = 256 * MiB


@dataclasses.dataclass(frozen=True)
class SustainedWrite:
    nbytes: int
    write_s: float  # first write to the close of the file
    total_s: float  # to every byte in tier-2 (the flush's return); write_s for the ceiling
    refusals: int
    bytes_before_refusal: int
    first_refusal_s: float | None

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.total_s / 1e6


@dataclasses.dataclass(frozen=True)
class SustainedRound:
    ceiling: SustainedWrite
    upload: Throughput
    upload_server_cpu_s: float
    tierfs: SustainedWrite
    daemon_cpu_s: float  # during the tierfs write and flush
    server_cpu_s: float

    @property
    def ratio(self) -> float:
        return self.tierfs.mb_per_s / self.ceiling.mb_per_s


def write_requests(path: Path, total_bytes: int, after: Callable[[], object] | None = None) -> SustainedWrite:
    """``total_bytes`` of zeros, one ``os.write`` per request retried on ENOSPC, then ``after()``."""
    view = memoryview(bytes(REQUEST_BYTES))
    os.sync()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = refusals = 0
    before_refusal, first_refusal_s = total_bytes, None
    start_s = perf_counter()
    try:
        while written < total_bytes:
            try:
                written += os.write(fd, view[: min(REQUEST_BYTES, total_bytes - written)])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if first_refusal_s is None:
                    first_refusal_s, before_refusal = perf_counter() - start_s, written
                refusals += 1
                sleep(REFUSAL_WAIT_S)
    finally:
        os.close(fd)
    write_s = perf_counter() - start_s
    if after is not None:
        after()
    return SustainedWrite(written, write_s, perf_counter() - start_s, refusals, before_refusal, first_refusal_s)


def upload_bound(options: dict[str, Any], object_bytes: int) -> Throughput:
    """s3fs ``pipe_file`` of ``object_bytes`` objects one after another, then deleted."""
    fs, setup_s = s3.new_s3fs(options, s3.BUCKET)
    data, count = bytes(object_bytes), max(1, UPLOAD_BOUND_BYTES // object_bytes)
    start_s = perf_counter()
    for index in range(count):
        fs.pipe_file(f"{s3.BUCKET}/upload-bound/{index}", data)
    seconds = perf_counter() - start_s
    fs.rm(f"{s3.BUCKET}/upload-bound", recursive=True)
    return Throughput(f"s3fs pipe_file, {object_bytes // MiB} MiB objects", count * object_bytes, seconds, setup_s)


def sustained_round(ceiling_file: Path, mount: Any, name: str, total_bytes: int, endpoint: s3.S3Endpoint
                    ) -> SustainedRound:
    """The ceiling, the upload bound and tierfs, one after another; the segment deleted after."""
    ceiling = write_requests(ceiling_file, total_bytes)
    server_before = procfs.cpu_s(endpoint.pid)
    upload = upload_bound(endpoint.storage_options(), StoreConfig().max_flush_bytes)
    upload_server_cpu_s = procfs.cpu_s(endpoint.pid) - server_before
    client = mount.client()
    try:
        daemon_before, server_before = procfs.cpu_s(mount.pid), procfs.cpu_s(endpoint.pid)
        tierfs = write_requests(mount.path(name), total_bytes, lambda: client.op("flush", path=name))
        daemon_s, server_s = procfs.cpu_s(mount.pid) - daemon_before, procfs.cpu_s(endpoint.pid) - server_before
        info = client.stat(name)
        if not isinstance(info, SegmentInfo) or info.flushed_length != total_bytes:
            raise RuntimeError(f"{name}: {info} after writing and flushing {total_bytes} bytes")
        client.delete(name)
    finally:
        client.close()
    return SustainedRound(ceiling, upload, upload_server_cpu_s, tierfs, daemon_s, server_s)


def format_sustained(rounds: list[SustainedRound]) -> list[str]:
    lines = ["sustained VD write, direct_io, MB/s: ceiling, upload bound, tierfs, until the backlog was full; "
             "refusals; tierfs/ceiling, tierfs/upload; CPU ms per MiB"]
    for index, r in enumerate(rounds, 1):
        t, mib = r.tierfs, r.tierfs.nbytes / MiB
        burst = (t.bytes_before_refusal / (t.first_refusal_s or t.write_s)) / 1e6
        full = f"{t.bytes_before_refusal / MiB:,.0f} MiB" + (f" ({t.first_refusal_s:.2f} s)" if t.first_refusal_s else "")
        lines += [f"round {index} ({mib:,.0f} MiB): {r.ceiling.mb_per_s:,.1f}, {r.upload.mb_per_s:,.1f}, "
                  f"{t.mb_per_s:,.1f}, {burst:,.1f}; {t.refusals}; {r.ratio:.3f}, {t.mb_per_s / r.upload.mb_per_s:.3f}; "
                  f"daemon {r.daemon_cpu_s * 1e3 / mib:.2f}, s3rver {r.server_cpu_s * 1e3 / mib:.2f}, upload bound's "
                  f"s3rver {r.upload_server_cpu_s * 1e3 / (r.upload.nbytes / MiB):.2f}",
                  f"  tierfs: backlog full {'after ' + full if t.refusals else 'never'}, last write returned at "
                  f"{t.write_s:.2f} s, all in tier-2 at {t.total_s:.2f} s"]
    return lines


def measure_mode(directory: Path, mode: str, endpoint: s3.S3Endpoint, args: argparse.Namespace,
                 layouts: list[s3.Layout]) -> tuple[dict[str, list[Any]], list[SustainedRound]]:
    size_mib, options, direct = args.size_mib, endpoint.storage_options(), mode == "direct_io"
    found: dict[str, list[Any]] = {key: [] for key in [*LEGEND, "gets", "cpu"]}
    sustained: list[SustainedRound] = []
    ceiling = MountProcess.minimal(directory / "ceiling-mnt", directory / "ceiling.log", "--data-bytes",
                                   str(size_mib * MiB), "--journal-dir", str(directory), *(["--direct-io"] * direct))
    config = s3_tier2(endpoint.url, durability="vd", block_cache_bytes=warm_cache_bytes(size_mib * MiB))
    try:
        with mounted(directory / "data", directory / "mnt", *(["--page-cache"] * (not direct)), config=config,
                     env=endpoint.environment()) as mount:
            if not layouts:
                say(f"writing {args.rounds} x {size_mib} MiB and flushing them to S3 ...")
                client = mount.client()
                layouts += [write_via_client(client, f"cold-{r}", make_payload(size_mib * MiB, 5 + r), durability="pd")
                            for r in range(args.rounds)]
                client.close()
            for r, layout in enumerate(layouts):
                say(f"[{mode}] round {r + 1}/{args.rounds}: ceilings, cold and warm read ...")
                found["ceiling"].append(dd(ceiling.mountpoint / "data", "/dev/null"))
                found["sink"].append(dd_write(ceiling.mountpoint / "sink", size_mib))
                found["journal"].append(dd_write(ceiling.mountpoint / "journal", size_mib))
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
                found["burst"].append(dd_write(mount.path(f"vd-{mode}-{r}"), size_mib))
                client.op("flush")  # untimed: the next round starts with no backlog
            client.close()
            for r in range(args.rounds if direct else 0):
                say(f"[{mode}] round {r + 1}/{args.rounds}: sustained VD write of {args.sustained_mib} MiB ...")
                sustained.append(sustained_round(ceiling.mountpoint / "journal", mount, f"sustained-{r}",
                                                 args.sustained_mib * MiB, endpoint))
    finally:
        ceiling.unmount()
    return found, sustained


def measure(directory: Path, args: argparse.Namespace) -> Report:
    require("fusermount3", "dd")
    with s3.s3_server(directory / "s3") as endpoint:
        layouts: list[s3.Layout] = []
        modes, sustained = {}, []
        for mode in MODES:
            modes[mode], found = measure_mode(directory, mode, endpoint, args, layouts)
            sustained += found
        say("raw s3fs 1 MiB cat_ranges of the same chunks; raw dd to the disk ...")
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

    sections = [[f"{key}: {label}" for key, label in LEGEND.items()]]
    for mode, m in modes.items():
        columns = {key: m[key] for key in LEGEND if m[key]}
        pairs = [("cold", "cat_file"), ("cold", "bound"), ("warm", "ceiling"), ("burst", "sink"), ("burst", "journal")]
        sections.append([f"{mode}:", *rounds_table(columns, [p for p in pairs if p[1] in columns]),
                         f"cold/raw s3fs 1 MiB ranged GETs, 16 in flight ({median(ranges):,.1f} MB/s) "
                         f"{median(m['cold']) / median(ranges):.3f}; burst/raw dd to a file on the disk "
                         f"({median(disk):,.1f} MB/s) {median(m['burst']) / median(disk):.3f}; GETs per cold read "
                         f"{m['gets']} for {args.size_mib} blocks; CPU s s3rver/tierfs daemon per cold read: "
                         + ", ".join(f"{server:.2f}/{daemon:.2f}" for server, daemon in m["cpu"])])
    d = modes["direct_io"]
    # the ceiling's reads pair with no particular warm read: the ratio of the medians
    checks = [Check("warm read / ceiling read", median(d["warm"]) / median(d["ceiling"]), 0.5, True, "x"),
              Check.over("sustained VD write / write(2)", [r.ratio for r in sustained], 0.9, True),
              Check.over("cold read / raw s3fs cat_file", ratios(d["cold"], d["cat_file"]), 1.0, True),
              Check("cold read GETs / (bytes / 1 MiB)", max(d["gets"]) / args.size_mib, 1.0, False, "x")]
    title = f"FUSE benchmark: {args.size_mib} MiB segments ({chunks} chunks each in s3rver); dd bs=1M"
    return Report(title, [*sections, format_sustained(sustained)], checks,
                  {"modes": modes, "sustained": sustained, "raw_cat_ranges": ranges, "raw_disk_write": disk})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default_mib = 2 * StoreConfig().max_backlog_bytes // MiB
    parser.add_argument("--sustained-mib", type=positive, default=default_mib,
                        help=f"bytes per sustained VD write, MiB (default {default_mib}: twice the flush backlog)")
    size_rounds(parser, 256, 3)
