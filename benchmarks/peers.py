"""Peers benchmark: the same file operations through tierfs, s3fs-fuse and rclone mount
(``--vfs-cache-mode`` off and full), all on one local S3 server, in one run; and on a
plain directory of the scratch disk (``local-disk``: the ceiling, never a peer).

Set-up (the benchmark's own): s3fs and rclone are installed with ``apt-get install -y
s3fs rclone`` when missing (as root; what apt installs is printed; a peer that cannot be
installed gets that error in every cell of its column). s3rver 3.7.1 (npm, see
``s3server.py``) runs on 127.0.0.1, and every system reaches it through a counting
proxy on loopback (``peer_proxy.py``) that counts requests by method and the bytes sent
to and received from S3. Each system has its own bucket; how each is mounted is in
``peer_mounts.py``. tierfs runs with ``tier2_url`` = its bucket, so its flushed bytes
are only in S3, and ``--tierfs-durability`` (default ``pd``, tierfs's default).

Per system, in this order (operations: ``peer_operations.py``):

1. a ``--size-mib`` (default 256) file of seeded random bytes: tierfs appends it through
   its API and flushes it (it must read its own segment); for the peers the same bytes
   are uploaded straight to s3rver as one object (they read plain objects);
2. cold mount (caches emptied: the system's process restarted, rclone's cache dir
   removed, and ``echo 3 > /proc/sys/vm/drop_caches`` after ``sync`` where permitted,
   which also empties s3rver's page cache), then ``dd bs=1M`` of the file (cold), again
   (warm), and ``--random-reads`` (default 100) 4 KiB preads at random offsets (warm);
3. cold mount again, then ``--random-reads`` 4 KiB preads, each in a different 1 MiB block;
4. ``--appends`` (default 2,000) x (write 4 KiB + fsync) on one O_APPEND descriptor of a
   new file; right after the last fsync, how many of its bytes S3 holds (the object's
   size; tierfs: ``user.tierfs.flushed_length``) shows what fsync promised; then the
   benchmark waits until everything is in S3 (no upload for 2 s), and the proxy's
   counts from the first append to then are the bytes each system moved;
5. ``tail -f -s 0.01`` of a new file, ``--tail-lines`` (default 20) lines each appended
   with open(O_APPEND)/write/close: p50 of the time until tail prints the line;
6. ``--small-files`` (default 10,000) files of 1 KiB created in a new directory (files/s,
   and the CPU of the mount's process per file), then a wait until the system has
   uploaded them (tierfs: until its flush backlog is empty; the others: no upload
   through the proxy for 2 s);
7. cold mount, ``ls -l`` of that directory (must list them all), and again.

Two floors do step 6 only (``peer_floor.py``; never peers): ``pyfuse3-floor``, a minimal
pyfuse3 filesystem in memory, and ``pyfuse3-pd-floor``, the same doing tierfs's two pd
syncs per file; the report prints the small-file bound they set.

One table: rows are the operations, columns the systems, and tierfs / best peer per
row (best: the highest rate or the lowest time among the peers that did it). A system
that cannot do an operation shows the error. A second table gives the S3 traffic of
each step (counted until it dies down after the step) and of each unmount + cold
mount. Every operation stops at ``--op-timeout-s`` and reports what it did by then; one
that makes no progress for ``--hang-s`` is a hang: the system's process is killed (the
blocked call returns an error, which becomes the cell) and it is mounted again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from benchmarks.common import (
    EXIT_USAGE,
    MiB,
    add_scratch_arguments,
    make_payload,
    percentile,
    run_in_scratch,
)
from benchmarks.peer_floor import FLOOR, FLOOR_SYSTEMS, NOT_SERVED, PD_FLOOR
from benchmarks.peer_mounts import (
    CEILING,
    PROGRAM_OF,
    PeerError,
    System,
    TierfsSystem,
)
from benchmarks.peer_mounts import (
    SYSTEMS as PEER_SYSTEMS,
)
from benchmarks.peer_operations import (
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
from benchmarks.peer_proxy import CountingProxy, total, traffic_difference
from benchmarks.peer_report import (
    NO_S3,
    NOT_PEERS,
    Cell,
    SystemResult,
    format_markdown,
    format_table,
    format_traffic,
    results_json,
    rows,
)
from benchmarks.peer_setup import install_peers, peer_versions
from benchmarks.read_bounds import process_cpu_of
from benchmarks.s3server import S3ServerError

SYSTEMS: dict[str, type[System]] = {**PEER_SYSTEMS, **FLOOR_SYSTEMS}

HELP = "tierfs vs s3fs-fuse and rclone mount (vfs cache off/full) on one local S3: reads, fsync'd appends, small files, ls, tail -f"

SEED = 19
COLD_FILE = "cold.bin"
APPEND_FILE = "appends.log"
TAIL_FILE = "tail.log"
SMALL_DIR = "small"
PAGE_CACHE_KEPT = "page cache not dropped"  # the note's start
ERRORS = (OSError, OperationError, PeerError, S3ServerError, RuntimeError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_scratch_arguments(parser, "s3rver's objects, the mounts' caches, tierfs's data dir")
    parser.add_argument("--size-mib", type=int, default=256, help="size of the file read cold and warm (default 256)")
    parser.add_argument("--small-files", type=int, default=10_000, help="small files created and listed (default 10,000)")
    parser.add_argument("--appends", type=int, default=2_000, help="4 KiB appends, each fsync'd (default 2,000)")
    parser.add_argument("--random-reads", type=int, default=100, help="4 KiB preads per random-read row (default 100)")
    parser.add_argument("--tail-lines", type=int, default=20, help="lines whose tail -f latency is measured (default 20)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all; {CEILING} is the "
                        f"ceiling: a directory on the scratch disk; {FLOOR} and {PD_FLOOR} the floor of a Python "
                        "FUSE filesystem creating small files, without and with tierfs's pd disk work; these three "
                        "are never counted as peers)")
    parser.add_argument("--tierfs-durability", choices=("vd", "pd", "tier2"), default="pd",
                        help="durability of the files tierfs creates (default pd, tierfs's default)")
    parser.add_argument("--op-timeout-s", type=float, default=600.0,
                        help="an operation stops after this long and reports what it did (default 600)")
    parser.add_argument("--hang-s", type=float, default=300.0,
                        help="an operation with no progress for this long is a hang: the system's process is killed, "
                        "the error is its cell, and it is mounted again for the next operation (default 300)")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the kernel page cache before cold mounts (quick checks only: the cold "
                        "rows may then be served partly from RAM, s3rver's files included)")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")


def run(args: argparse.Namespace) -> int:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        print(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}", file=sys.stderr)
        return EXIT_USAGE
    if min(args.size_mib, args.small_files, args.appends, args.random_reads, args.tail_lines) < 1:
        print("--size-mib, --small-files, --appends, --random-reads and --tail-lines must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    args.systems = systems
    log = sys.stderr
    return run_in_scratch("peers", args.dir, args.json, lambda d: measure(d, args, log), lambda _: [],
                          lambda machine, results, _, out: report(machine, results, args, out),
                          lambda machine, results, _: {"machine": machine, **results_json(
                              rows(args.size_mib, args.small_files, args.appends, args.random_reads), results["systems"]),
                              "versions": results["versions"]},
                          errors=(S3ServerError, PeerError))


def measure(directory: Path, args: argparse.Namespace, log: TextIO) -> dict[str, Any]:
    """Every system's column (see the module docstring)."""
    from benchmarks.peer_proxy import counting_proxy
    from benchmarks.s3server import s3_server

    if not Path("/dev/fuse").exists():
        raise PeerError("/dev/fuse is missing")
    unavailable = install_peers({PROGRAM_OF[s] for s in args.systems if s in PROGRAM_OF}, log)
    size = args.size_mib * MiB
    payload = make_payload(size, SEED)
    payload_file = directory / "payload.bin"
    payload_file.write_bytes(payload)
    results: list[SystemResult] = []
    with s3_server(directory / "s3", log) as endpoint, counting_proxy(endpoint.url, directory / "proxy.log") as proxy:
        for name in args.systems:
            system_class = SYSTEMS[name]
            if PROGRAM_OF.get(name) in unavailable:
                result = SystemResult(name, "", system_class.cache_emptying)
                for row in rows(args.size_mib, args.small_files, args.appends, args.random_reads):
                    result.cells[row.key] = Cell.failed(unavailable[PROGRAM_OF[name]])
                results.append(result)
                continue
            if system_class is TierfsSystem:
                system: System = TierfsSystem(directory, endpoint, proxy.url, size, durability=args.tierfs_durability)
            else:
                system = system_class(directory, endpoint, proxy.url, size)
            system.drop_page_cache = not args.keep_page_cache
            results.append(SystemRun(system, proxy, args, payload, payload_file, log).run())
    return {"systems": results, "versions": peer_versions()}


class SystemRun:
    """One system's column: each step records its cells (or its error) and the S3
    traffic between its start and its end."""

    def __init__(self, system: System, proxy: CountingProxy, args: argparse.Namespace, payload: bytes,
                 payload_file: Path, log: TextIO) -> None:
        self.system, self.proxy, self.args, self.log = system, proxy, args, log
        self.payload, self.payload_file = payload, payload_file
        self.result = SystemResult(system.name, system.fsync_mechanism(), system.cache_emptying)
        self.progress = Progress()

    def step(self, traffic_key: str, keys: tuple[str, ...], action: Any) -> bool:
        """Run ``action`` (it returns {key: Cell}) under the watchdog; on an error every
        key gets it. A system found unmounted (killed after a hang) is mounted first."""
        print(f"[{self.system.name}] {traffic_key} ...", file=self.log, flush=True)
        before = self.proxy.snapshot()
        hung = [False]
        try:
            if traffic_key != "prepare" and not self.system.is_mounted():
                self.result.notes.append(f"mounted again before {traffic_key}")
                self.system.mount()
            with watchdog(self.progress, self.args.hang_s, self.system.kill) as hung:
                self.result.cells.update(action())
            succeeded = True
        except ERRORS as e:
            text = f"{type(e).__name__}: {e}" if not isinstance(e, OperationError) else str(e)
            if hung[0]:
                text = f"hung: no progress for {self.args.hang_s:g} s, {self.system.name} killed ({text})"
            error = Cell.failed(text)
            self.result.cells.update({key: error for key in keys if key not in self.result.cells})
            succeeded = False
        if not wait_idle(self.proxy.snapshot):
            self.result.notes.append(f"{traffic_key}: S3 traffic had not died down after {SETTLE_TIMEOUT_S:g} s")
        self.result.traffic[traffic_key] = traffic_difference(self.proxy.snapshot(), before)
        return succeeded

    def mount_cold(self, keys: tuple[str, ...]) -> bool:
        """Unmount, empty the caches, mount; the S3 traffic of it all (an unmount may
        upload what was pending) is kept as ``remount:<first key>``."""
        before = self.proxy.snapshot()
        try:
            self.system.mount_cold()
        except ERRORS as e:
            for key in keys:
                self.result.cells[key] = Cell.failed(f"cold mount failed: {e}")
            return False
        finally:
            self.result.traffic[f"remount:{keys[0]}"] = traffic_difference(self.proxy.snapshot(), before)
        if self.system.page_cache_note and self.system.page_cache_note not in self.result.notes:
            self.result.notes.append(f"{PAGE_CACHE_KEPT}: {self.system.page_cache_note}")
        return True

    def run(self) -> SystemResult:
        system, args = self.system, self.args
        every = tuple(r.key for r in rows(args.size_mib, args.small_files, args.appends, args.random_reads))
        try:
            if system.small_files_only:
                if self.step("prepare", every, self.mount_only):
                    self.step("create", ("create", "create_cpu"), lambda: self.create([0]))
                for key in every:
                    self.result.cells.setdefault(key, Cell.not_measured(NOT_SERVED))
                return self.result
            if not self.step("prepare", every, self.prepare):
                return self.result
            if self.mount_cold(("cold_read", "warm_read", "random_warm")):
                if self.step("cold_read", ("cold_read", "warm_read"), lambda: {"cold_read": self.sequential()}):
                    self.step("warm_read", ("warm_read",), lambda: {"warm_read": self.sequential()})
                self.step("random_warm", ("random_warm",), lambda: self.random(distinct=False))
            if self.mount_cold(("random_cold", "random_cold_total")):
                self.step("random_cold", ("random_cold", "random_cold_total"), lambda: self.random(distinct=True))
            self.step("appends", ("appends", "append_up", "append_down", "fsync_s3"), self.appends)
            self.step("tail", ("tail",), self.tail)
            created = [0]
            self.step("create", ("create", "create_cpu"), lambda: self.create(created))
            if self.mount_cold(("ls_fresh", "ls_again")) and created[0]:
                if self.step("ls_fresh", ("ls_fresh",), lambda: self.ls("ls_fresh", created[0])):
                    self.step("ls_again", ("ls_again",), lambda: self.ls("ls_again", created[0]))
            for key in ("ls_fresh", "ls_again"):
                self.result.cells.setdefault(key, Cell.failed("no files were created"))
        finally:
            try:
                system.unmount()
            except ERRORS as e:
                self.result.notes.append(f"unmount: {e}")
        return self.result

    # ------------------------------------------------------------- the steps
    def mount_only(self) -> dict[str, Cell]:
        """A floor's set-up: no bucket, no cold file."""
        self.system.mount()
        return {}

    def prepare(self) -> dict[str, Cell]:
        self.system.create_bucket()
        self.system.mount()
        self.system.prepare_cold_file(COLD_FILE, self.payload_file)
        return {}

    def sequential(self) -> Cell:
        mb_per_s, _ = sequential_read(self.system.path(COLD_FILE), len(self.payload))
        return Cell(mb_per_s)

    def random(self, distinct: bool) -> dict[str, Cell]:
        """Warm: p50 of the reads; fresh mount (``distinct`` 1 MiB blocks): p50 and the
        total, which shows a system that fetches the whole file on its first read."""
        seconds = random_reads(self.system.path(COLD_FILE), self.payload, self.args.random_reads,
                               SEED + distinct, distinct_blocks=distinct, beat=self.progress.beat)
        p50 = Cell(percentile(sorted(seconds), 0.5) * 1e3)
        return {"random_cold": p50, "random_cold_total": Cell(sum(seconds))} if distinct else {"random_warm": p50}

    def appends(self) -> dict[str, Cell]:
        system, args = self.system, self.args
        before = self.proxy.snapshot()
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
            for key in ("append_up", "append_down"):
                cells[key] = Cell.failed(f"the appended bytes did not all reach S3: {e}")
            return cells
        moved = total(traffic_difference(self.proxy.snapshot(), before))
        cells["append_up"] = Cell(moved.bytes_up / MiB)
        cells["append_down"] = Cell(moved.bytes_down / MiB)
        return cells

    def tail(self) -> dict[str, Cell]:
        seconds = tail_latencies(self.system.path(TAIL_FILE), self.args.tail_lines, SEED, self.progress.beat)
        return {"tail": Cell(percentile(sorted(seconds), 0.5) * 1e3)}

    def create(self, created: list[int]) -> dict[str, Cell]:
        directory = self.system.path(SMALL_DIR)
        directory.mkdir()
        pid = self.system.process_id()
        cpu_before_s = process_cpu_of(pid)
        count, seconds = create_small_files(directory, self.args.small_files, self.args.op_timeout_s,
                                            self.progress.beat)
        cpu_s = process_cpu_of(pid) - cpu_before_s
        created[0] = count
        note = f"({count:,} in {seconds:.0f} s)" if count < self.args.small_files else ""
        cell = Cell(count / seconds, note)
        cpu = Cell(cpu_s * 1e3 / count) if pid is not None and count else Cell.not_measured(
            "no process of its own: the kernel's filesystem")
        try:
            settle(self.proxy.snapshot, self.system.settle_min_s, lambda: not self.system.uploads_pending(),
                   self.progress.beat)
        except OperationError as e:
            self.result.notes.append(f"small files: {e}")
        return {"create": cell, "create_cpu": cpu}

    def ls(self, key: str, expected: int) -> dict[str, Cell]:
        return {key: Cell(list_long(self.system.path(SMALL_DIR), expected))}


# ------------------------------------------------------------------ report
def small_files_bound(results: list[SystemResult]) -> str:
    """The small-file row's bound, from the floors measured in the same run."""
    rate = {r.name: c.value for r in results for c in [r.cells.get("create")]
            if c is not None and c.ok and c.value is not None}
    peers = {name: value for name, value in rate.items() if name not in NOT_PEERS}
    floor, tierfs = rate.get(PD_FLOOR), rate.get("tierfs")
    if floor is None or not peers:
        return f"small files, the bound: not measured (needs {PD_FLOOR} and a peer in the same run)"
    best = max(peers, key=lambda name: peers[name])
    text = (f"small files, the bound: {PD_FLOOR} (a pyfuse3 filesystem doing the disk work of tierfs's pd "
            f"promise per file and nothing else: one sync) {floor:,.0f} files/s = {floor / peers[best]:.2f}x the best peer ({best} "
            f"{peers[best]:,.0f})")
    if FLOOR in rate:
        text += f"; without the disk work {rate[FLOOR]:,.0f} files/s = {rate[FLOOR] / peers[best]:.2f}x"
    if tierfs is not None:
        text += f"; tierfs = {tierfs / floor:.2f}x the pd floor"
    return text


def report(machine: dict[str, Any], measured: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    results: list[SystemResult] = measured["systems"]
    table_rows = rows(args.size_mib, args.small_files, args.appends, args.random_reads)
    fs = machine["filesystem"]
    print(f"Peers benchmark: {machine['cpus']} CPUs, {fs['fs_type']} on {fs['device']}; S3 = s3rver 3.7.1 on "
          f"127.0.0.1 behind a counting proxy; tierfs durability {args.tierfs_durability}", file=out)
    for program, version in measured["versions"].items():
        print(f"  {program}: {version}", file=out)
    print(file=out)
    format_table(table_rows, results, out)
    print(small_files_bound(results), file=out)
    print(file=out)
    print(f"what fsync promised (after the last of {args.appends:,} fsync'd 4 KiB appends, file still open):",
          file=out)
    for result in results:
        print(f"  {result.name}: {result.fsync_summary(args.appends)}", file=out)
    print(file=out)
    print("caches emptied before each cold mount:", file=out)
    for result in results:
        print(f"  {result.name}: {result.cache_emptying}", file=out)
    kept = sorted({n for r in results for n in r.notes if n.startswith(PAGE_CACHE_KEPT)})
    print("  and the kernel page cache: " + ("; ".join(n.replace(PAGE_CACHE_KEPT, "not dropped") for n in kept) if kept else
          "dropped (sync, then echo 3 > /proc/sys/vm/drop_caches) before every cold mount"), file=out)
    notes = [f"  {r.name}: {note}" for r in results for note in r.notes if note not in kept]
    if notes:
        print("notes:", file=out)
        for line in notes:
            print(line, file=out)
    print(file=out)
    format_traffic(table_rows, results, out)
    if args.markdown:
        print(file=out)
        format_markdown(table_rows, results, args.appends, out)
