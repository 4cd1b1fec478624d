"""Peers benchmark: the same file operations through tierfs, s3fs-fuse and rclone mount
(``--vfs-cache-mode`` off and full) on one local S3 server (s3rver, behind the counting
proxy of ``proxy.py``), in one run, and on a directory of the scratch disk
(``local-disk``, the ceiling, never a peer). Per system (``mounts.py``), in this order
(``operations.py``):

1. a ``--size-mib`` (256) file: tierfs appends it through its API and flushes it; for the
   peers it is uploaded straight to s3rver as one object;
2. cold mount (process restarted, cache directory removed, the kernel page cache dropped
   where permitted), ``dd bs=1M`` of the file, again (warm), ``--random-reads`` (100) 4 KiB
   preads (warm); 3. cold mount, the preads each in a different 1 MiB block;
4. ``--appends`` (2,000) x (write 4 KiB + fsync): the bytes S3 holds right after the last
   fsync show what fsync promised; the proxy's counts until all is in S3, what each moved;
5. ``tail -f -s 0.01`` of a new file, ``--tail-lines`` (20) lines appended by
   open/write/close: p50 until tail prints each;
6. ``--small-files`` (10,000) files of 1 KiB (files/s, the mount process's CPU per file),
   then a wait until they are uploaded; 7. cold mount, ``ls -l`` of them, and again.

Two floors do step 6 only (``pyfuse3-floor``, ``pyfuse3-pd-floor``: ``harness.minimal_fs``);
the report prints the small-file bound they set. Tables: a row per operation with
tierfs / best peer, and the S3 traffic of each step. An operation stops at
``--op-timeout-s``; one with no progress for ``--hang-s`` is a hang: the system's process
is killed, the error is its cell, and it is mounted again for the next step.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from benchmarks.harness.figures import MiB, make_payload, percentile
from benchmarks.harness.fuse import BenchError, require
from benchmarks.harness.s3 import S3ServerError, s3_server
from benchmarks.harness.scenario import (
    Report,
    UsageError,
    add_scratch_arguments,
    at_least_one,
    run_scenario,
)
from benchmarks.peers.mounts import (
    CEILING,
    FLOOR,
    PD_FLOOR,
    SYSTEMS,
    System,
    install_peers,
    peer_versions,
)
from benchmarks.peers.operations import (
    APPEND_BYTES,
    SETTLE_TIMEOUT_S,
    OperationError,
    Progress,
    appends,
    create_small_files,
    list_long,
    random_reads,
    sequential_read,
    settle,
    tail_latencies,
    wait_idle,
    watchdog,
)
from benchmarks.peers.proxy import CountingProxy, counting_proxy, total, traffic_difference
from benchmarks.peers.report import (
    NO_S3,
    Cell,
    SystemResult,
    format_markdown,
    format_table,
    format_traffic,
    results_json,
    rows,
    small_files_bound,
)

HELP = ("tierfs vs s3fs-fuse and rclone mount (vfs cache off/full) on one local S3: reads, fsync'd appends, small "
        "files, ls, tail -f")
SEED = 19
COLD_FILE, APPEND_FILE, TAIL_FILE, SMALL_DIR = "cold.bin", "appends.log", "tail.log", "small"
PAGE_CACHE_KEPT = "page cache not dropped"
ERRORS = (OSError, OperationError, BenchError, S3ServerError, RuntimeError)


class SystemRun:
    """One system's column: each step records its cells (or its error) and the S3 traffic
    between its start and the moment that traffic died down."""

    def __init__(self, system: System, proxy: CountingProxy, args: argparse.Namespace, payload_file: Path,
                 log: TextIO) -> None:
        self.system, self.proxy, self.args, self.log, self.payload_file = system, proxy, args, log, payload_file
        self.payload = payload_file.read_bytes()
        self.result = SystemResult(system.name, system.fsync_mechanism(), system.cache_emptying)
        self.progress = Progress()
        self.keys = [row.key for row in rows(args.size_mib, args.small_files, args.appends, args.random_reads)]

    def step(self, traffic_key: str, keys: tuple[str, ...], action: Callable[[], dict[str, Cell]]) -> bool:
        """``action`` under the watchdog; on an error every key gets it. A system found
        unmounted (killed after a hang) is mounted first."""
        print(f"[{self.system.name}] {traffic_key} ...", file=self.log, flush=True)
        before, hung = self.proxy.snapshot(), [False]
        try:
            if traffic_key != "prepare" and not self.system.is_mounted():
                self.result.notes.append(f"mounted again before {traffic_key}")
                self.system.mount()
            with watchdog(self.progress, self.args.hang_s, self.system.kill) as hung:
                self.result.cells.update(action())
            succeeded = True
        except ERRORS as e:
            text = str(e) if isinstance(e, OperationError) else f"{type(e).__name__}: {e}"
            if hung[0]:
                text = f"hung: no progress for {self.args.hang_s:g} s, {self.system.name} killed ({text})"
            self.result.cells.update({key: Cell.failed(text) for key in keys if key not in self.result.cells})
            succeeded = False
        if not wait_idle(self.proxy.snapshot):
            self.result.notes.append(f"{traffic_key}: S3 traffic had not died down after {SETTLE_TIMEOUT_S:g} s")
        self.result.traffic[traffic_key] = traffic_difference(self.proxy.snapshot(), before)
        return succeeded

    def mount_cold(self, keys: tuple[str, ...]) -> bool:
        """Unmount, empty the caches, mount; the traffic of it all is ``remount:<first key>``."""
        before = self.proxy.snapshot()
        try:
            self.system.mount_cold()
        except ERRORS as e:
            self.result.cells.update({key: Cell.failed(f"cold mount failed: {e}") for key in keys})
            return False
        finally:
            self.result.traffic[f"remount:{keys[0]}"] = traffic_difference(self.proxy.snapshot(), before)
        note = self.system.page_cache_note
        if note and f"{PAGE_CACHE_KEPT}: {note}" not in self.result.notes:
            self.result.notes.append(f"{PAGE_CACHE_KEPT}: {note}")
        return True

    def run(self) -> SystemResult:
        system, created = self.system, [0]
        try:
            if system.small_files_only:
                if self.step("prepare", tuple(self.keys), self.mount_only):
                    self.step("create", ("create", "create_cpu"), lambda: self.create(created))
                for key in self.keys:
                    self.result.cells.setdefault(key, Cell.not_measured("a floor for the small-file step only"))
                return self.result
            if not self.step("prepare", tuple(self.keys), self.prepare):
                return self.result
            if self.mount_cold(("cold_read", "warm_read", "random_warm")):
                if self.step("cold_read", ("cold_read", "warm_read"), lambda: {"cold_read": self.sequential()}):
                    self.step("warm_read", ("warm_read",), lambda: {"warm_read": self.sequential()})
                self.step("random_warm", ("random_warm",), lambda: self.random(distinct=False))
            if self.mount_cold(("random_cold", "random_cold_total")):
                self.step("random_cold", ("random_cold", "random_cold_total"), lambda: self.random(distinct=True))
            self.step("appends", ("appends", "append_up", "append_down", "fsync_s3"), self.appends)
            self.step("tail", ("tail",), lambda: {"tail": Cell(percentile(sorted(tail_latencies(
                system.path(TAIL_FILE), self.args.tail_lines, SEED, self.progress.beat)), 0.5) * 1e3)})
            self.step("create", ("create", "create_cpu"), lambda: self.create(created))
            if self.mount_cold(("ls_fresh", "ls_again")) and created[0]:
                for key in ("ls_fresh", "ls_again"):
                    if not self.step(key, (key,), functools.partial(self.ls, key, created[0])):
                        break
            for key in ("ls_fresh", "ls_again"):
                self.result.cells.setdefault(key, Cell.failed("no files were created"))
        finally:
            try:
                system.unmount()
            except ERRORS as e:
                self.result.notes.append(f"unmount: {e}")
        return self.result

    def mount_only(self) -> dict[str, Cell]:
        """A floor's set-up: no bucket, no cold file."""
        self.system.mount()
        return {}

    def ls(self, key: str, expected: int) -> dict[str, Cell]:
        return {key: Cell(list_long(self.system.path(SMALL_DIR), expected))}

    def prepare(self) -> dict[str, Cell]:
        self.system.create_bucket()
        self.system.mount()
        self.system.prepare_cold_file(COLD_FILE, self.payload_file)
        return {}

    def sequential(self) -> Cell:
        return Cell(sequential_read(self.system.path(COLD_FILE), len(self.payload))[0])

    def random(self, distinct: bool) -> dict[str, Cell]:
        """Warm: p50; fresh mount (``distinct`` 1 MiB blocks): p50 and the total, which
        shows a system that fetches the whole file on its first read."""
        seconds = random_reads(self.system.path(COLD_FILE), self.payload, self.args.random_reads, SEED + distinct,
                               distinct_blocks=distinct, beat=self.progress.beat)
        p50 = Cell(percentile(sorted(seconds), 0.5) * 1e3)
        return {"random_cold": p50, "random_cold_total": Cell(sum(seconds))} if distinct else {"random_warm": p50}

    def appends(self) -> dict[str, Cell]:
        system, args, before = self.system, self.args, self.proxy.snapshot()
        run = appends(system.path(APPEND_FILE), args.appends, args.op_timeout_s,
                      lambda: system.bytes_in_s3(APPEND_FILE), self.progress.beat)
        expected = run.appended * APPEND_BYTES
        note = f"({run.appended:,} in {run.seconds:.0f} s)" if run.stopped_early else ""
        cells = {"appends": Cell(run.rate, note), "fsync_s3": Cell(run.in_s3_at_last_fsync / MiB)}
        if not system.has_s3:
            return cells | {"append_up": Cell(0.0), "append_down": Cell(0.0), "fsync_s3": Cell(0.0, NO_S3)}
        try:
            waited = settle(self.proxy.snapshot, system.settle_min_s,
                            lambda: system.bytes_in_s3(APPEND_FILE) >= expected, self.progress.beat)
            self.result.notes.append(f"appends: all {expected / MiB:.2f} MiB in S3 {waited:.1f} s after the close")
        except OperationError as e:
            return cells | {key: Cell.failed(f"the appended bytes did not all reach S3: {e}")
                            for key in ("append_up", "append_down")}
        moved = total(traffic_difference(self.proxy.snapshot(), before))
        return cells | {"append_up": Cell(moved.bytes_up / MiB), "append_down": Cell(moved.bytes_down / MiB)}

    def create(self, created: list[int]) -> dict[str, Cell]:
        from benchmarks.harness import procfs

        directory = self.system.path(SMALL_DIR)
        directory.mkdir()
        pid = self.system.process_id()
        cpu_before_s = procfs.cpu_s(pid)
        count, seconds = create_small_files(directory, self.args.small_files, self.args.op_timeout_s,
                                            self.progress.beat)
        cpu_s, created[0] = procfs.cpu_s(pid) - cpu_before_s, count
        cell = Cell(count / seconds, f"({count:,} in {seconds:.0f} s)" if count < self.args.small_files else "")
        cpu = Cell(cpu_s * 1e3 / count) if pid is not None and count else Cell.not_measured(
            "no process of its own: the kernel's filesystem")
        try:
            settle(self.proxy.snapshot, self.system.settle_min_s, lambda: not self.system.uploads_pending(),
                   self.progress.beat)
        except OperationError as e:
            self.result.notes.append(f"small files: {e}")
        return {"create": cell, "create_cpu": cpu}


def measure(directory: Path, args: argparse.Namespace) -> Report:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise UsageError(f"--systems: choose from {', '.join(SYSTEMS)}")
    at_least_one(args, "size_mib", "small_files", "appends", "random_reads", "tail_lines")
    require()
    log, size = sys.stderr, args.size_mib * MiB
    unavailable = install_peers({SYSTEMS[s].program for s in systems if SYSTEMS[s].program}, log)
    payload_file = directory / "payload.bin"
    payload_file.write_bytes(make_payload(size, SEED))
    results: list[SystemResult] = []
    with s3_server(directory / "s3", log, bucket=None) as endpoint, \
            counting_proxy(endpoint.url, directory / "proxy.log") as proxy:
        for name in systems:
            system = SYSTEMS[name](directory, endpoint, proxy.url, size, args.tierfs_durability)
            if system.program in unavailable:
                result = SystemResult(name, "", system.cache_emptying)
                result.cells = {key: Cell.failed(unavailable[system.program]) for key in
                                (r.key for r in rows(args.size_mib, args.small_files, args.appends, args.random_reads))}
                results.append(result)
                continue
            system.drop_page_cache = not args.keep_page_cache
            results.append(SystemRun(system, proxy, args, payload_file, log).run())
    return report(results, peer_versions(), args)


def report(results: list[SystemResult], versions: dict[str, str], args: argparse.Namespace) -> Report:
    table_rows = rows(args.size_mib, args.small_files, args.appends, args.random_reads)
    kept = sorted({n for r in results for n in r.notes if n.startswith(PAGE_CACHE_KEPT)})
    facts = [f"what fsync promised (after the last of {args.appends:,} fsync'd 4 KiB appends, file still open):",
             *(f"  {r.name}: {r.fsync_summary(args.appends)}" for r in results),
             "caches emptied before each cold mount:", *(f"  {r.name}: {r.cache_emptying}" for r in results),
             "  and the kernel page cache: " + ("; ".join(n.replace(PAGE_CACHE_KEPT, "not dropped") for n in kept)
                                                if kept else "dropped (sync, then echo 3 > /proc/sys/vm/drop_caches) "
                                                "before every cold mount")]
    notes = [f"  {r.name}: {note}" for r in results for note in r.notes if note not in kept]
    sections = [[f"  {program}: {version}" for program, version in versions.items()],
                [*format_table(table_rows, results), small_files_bound(results)], facts + (["notes:", *notes] if notes
                                                                                             else []),
                format_traffic(table_rows, results)]
    if args.markdown:
        sections.append(format_markdown(table_rows, results, args.appends))
    title = (f"Peers benchmark: S3 = s3rver 3.7.1 on 127.0.0.1 behind a counting proxy; tierfs durability "
             f"{args.tierfs_durability}")
    return Report(title, sections, [], {**results_json(table_rows, results), "versions": versions})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser, "s3rver's objects, the mounts' caches, tierfs's data dir")
    parser.add_argument("--size-mib", type=int, default=256, help="size of the file read cold and warm (default 256)")
    parser.add_argument("--small-files", type=int, default=10_000, help="small files created and listed (default 10,000)")
    parser.add_argument("--appends", type=int, default=2_000, help="4 KiB appends, each fsync'd (default 2,000)")
    parser.add_argument("--random-reads", type=int, default=100, help="4 KiB preads per random-read row (default 100)")
    parser.add_argument("--tail-lines", type=int, default=20, help="lines whose tail -f latency is measured (default 20)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all; {CEILING} is the ceiling, "
                        f"a directory on the scratch disk; {FLOOR} and {PD_FLOOR} the floor of a Python FUSE filesystem "
                        "creating small files, without and with tierfs's pd disk work; these three are never peers)")
    parser.add_argument("--tierfs-durability", choices=("vd", "pd", "tier2"), default="pd",
                        help="durability of the files tierfs creates (default pd, tierfs's default)")
    parser.add_argument("--op-timeout-s", type=float, default=600.0,
                        help="an operation stops after this long and reports what it did (default 600)")
    parser.add_argument("--hang-s", type=float, default=300.0,
                        help="an operation with no progress for this long is a hang: the system's process is killed, "
                        "the error is its cell, and it is mounted again for the next operation (default 300)")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the kernel page cache before cold mounts (quick checks only: the cold rows "
                        "may then be served partly from RAM, s3rver's files included)")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")


def run(args: argparse.Namespace) -> int:
    return run_scenario("peers", args, lambda directory: measure(directory, args), errors=ERRORS)
