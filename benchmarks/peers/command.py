"""Peers benchmark: the same file operations through tierfs, s3fs-fuse and rclone mount
(``--vfs-cache-mode`` off and full) on one s3rver behind the counting proxy of
``proxy.py``, in one run, and on a directory of the scratch disk (``local-disk``, the
ceiling, never a peer). Per system (``mounts.py``), in this order (``operations.py``):

1. a ``--size-mib`` (256) file: tierfs appends it through its API and flushes it; for the
   peers it is uploaded straight to s3rver as one object;
2. cold mount (process restarted, cache directory removed, the page cache dropped where
   permitted), ``dd bs=1M`` of the file, again (warm), ``--random-reads`` (100) 4 KiB
   preads (warm); 3. cold mount, the preads each in a different 1 MiB block;
4. ``--appends`` (2,000) x (write 4 KiB + fsync): the bytes S3 holds right after the last
   fsync show what fsync promised; the proxy's counts until all is in S3;
5. ``tail -f -s 0.01`` of a new file, ``--tail-lines`` (20) lines appended: p50;
6. ``--small-files`` (10,000) files of 1 KiB (files/s, the mount process's CPU per file),
   then a wait until they are uploaded; 7. cold mount, ``ls -l`` of them, and again.

Two floors do step 6 only (``pyfuse3-floor``, ``pyfuse3-pd-floor``: ``harness.minimal_fs``)
and set the small-file bound. Tables: a row per operation with tierfs / best peer, and
the S3 traffic of each step. An operation still running after 30 minutes is a hang: the
system's process is killed, the error is its cell, and it is mounted again.

Invariants of the report: a cell is a measured value or the error that stopped the
operation, never blank (a system that was not run is no column at all); the ratio
compares tierfs with the best peer that produced a figure (the highest rate, the lowest
time), and a row with no such peer, or a tierfs error, has none.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import procfs
from benchmarks.harness.figures import MiB, make_payload, percentile
from benchmarks.harness.mounts import dd, require
from benchmarks.harness.s3 import s3_server
from benchmarks.harness.scenario import Report, UsageError, positive, say, table
from benchmarks.peers import mounts
from benchmarks.peers import operations as ops
from benchmarks.peers.mounts import CEILING, FLOOR, PD_FLOOR, SYSTEMS
from benchmarks.peers.proxy import CountingProxy, Traffic, total, traffic_difference

HELP = ("tierfs vs s3fs-fuse and rclone mount (vfs cache off/full) on one local S3: reads, fsync'd appends, small "
        "files, ls, tail -f")
SEED = 19
COLD_FILE, APPEND_FILE, TAIL_FILE, SMALL_DIR = "cold.bin", "appends.log", "tail.log", "small"
PAGE_CACHE_KEPT = "page cache not dropped"
NOT_PEERS = ("tierfs", CEILING, FLOOR, PD_FLOOR)  # never the "best peer"
NO_S3 = "(no S3)"  # the note of a figure that has no S3 side (the local-disk ceiling)
ERROR_CHARS, CELL_CHARS = 400, 17
TRAFFIC_ORDER = ["prepare", "cold_read", "warm_read", "random_warm", "random_cold", "appends", "tail", "create",
                 "ls_fresh", "ls_again"]


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    higher_is_better: bool | None  # None: a fact, not a speed (no ratio)
    digits: int


def rows(size_mib: int, small_files: int, appends: int, random_reads: int) -> list[Row]:
    return [
        Row("cold_read", f"cold sequential read, {size_mib} MiB, dd bs=1M", "MB/s", True, 1),
        Row("warm_read", "warm re-read, dd bs=1M", "MB/s", True, 1),
        Row("random_warm", "random 4 KiB pread p50, warm", "ms", False, 3),
        Row("random_cold", "random 4 KiB pread p50, fresh mount", "ms", False, 2),
        Row("random_cold_total", f"  all {random_reads} of them (first one included)", "s", False, 3),
        Row("appends", f"{appends:,} x (4 KiB append + fsync)", "appends/s", True, 0),
        Row("append_up", "  the appends: sent to S3", "MiB", False, 2),
        # a fact: a few KiB of background reads (tierfs's owner checks), no speed to compare
        Row("append_down", "  the appends: received from S3", "MiB", None, 2),
        Row("fsync_s3", "  in S3 right after the last fsync", "MiB", None, 3),
        Row("create", f"create {small_files:,} small files", "files/s", True, 0),
        Row("create_cpu", "  CPU of the mount's process per file", "ms", False, 3),
        Row("ls_fresh", "ls -l of them, fresh mount", "s", False, 2),
        Row("ls_again", "ls -l of them again", "s", False, 2),
        Row("tail", "append -> shown by tail -f -s 0.01, p50", "ms", False, 1),
    ]


@dataclasses.dataclass(frozen=True)
class Cell:
    value: float | None = None
    note: str = ""  # shown after the value
    error: str = ""
    measured: bool = True  # False: the system does not do this (``error`` says why)

    @classmethod
    def failed(cls, error: str) -> Cell:
        """Whitespace folded; a long text keeps its start and its end (a process's
        stderr ends with the error that stopped it)."""
        text = " ".join(error.split()) or "failed"
        if len(text) > ERROR_CHARS:
            text = f"{text[: ERROR_CHARS // 3]} ... {text[-(ERROR_CHARS - ERROR_CHARS // 3):]}"
        return cls(error=text)

    @property
    def ok(self) -> bool:
        return self.value is not None and not self.error and math.isfinite(self.value)

    def text(self, row: Row) -> str:
        if self.error:
            return f"{'error' if self.measured else 'not measured'}: {self.error}"
        return "?" if self.value is None else f"{self.value:,.{row.digits}f}" + (f" {self.note}" if self.note else "")


@dataclasses.dataclass
class SystemResult:
    name: str
    fsync_mechanism: str
    cache_emptying: str
    cells: dict[str, Cell] = dataclasses.field(default_factory=dict)
    traffic: dict[str, Traffic] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def fsync_summary(self, appends: int) -> str:
        held = self.cells.get("fsync_s3", Cell())
        if held.ok and held.note != NO_S3:
            return f"{self.fsync_mechanism}; measured: S3 held {held.value:.3f} of {appends * 4096 / MiB:.3f} MiB " \
                   "right after the last fsync"
        return f"{self.fsync_mechanism}; not measured: {held.error}" if held.error else self.fsync_mechanism


def ratio(row: Row, results: list[SystemResult]) -> float | None:
    """tierfs / best peer for ``row`` (None when it does not apply)."""
    tierfs = next((r.cells.get(row.key) for r in results if r.name == "tierfs"), None)
    peers = [c.value for r in results if r.name not in NOT_PEERS for c in [r.cells.get(row.key)]
             if c is not None and c.ok and c.value is not None]
    if row.higher_is_better is None or tierfs is None or not tierfs.ok or tierfs.value is None or not peers:
        return None
    best = max(peers) if row.higher_is_better else min(peers)
    return tierfs.value / best if best else None


def _table(table_rows: list[Row], results: list[SystemResult], cell: Callable[[Row, Cell], str]) -> list[list[str]]:
    """A row per operation: label, unit, each system's cell, the ratio tierfs / best peer."""
    found = []
    for row in table_rows:
        value = ratio(row, results)
        shown = f"{value:.2f}" if value is not None else "" if row.higher_is_better is None else "n/a"
        found.append([row.label, row.unit, *(cell(row, r.cells.get(row.key, Cell.failed("not measured")))
                                             for r in results), shown])
    return found


def format_table(table_rows: list[Row], results: list[SystemResult]) -> list[str]:
    """The plain-text table; errors are numbered in it and given whole below it."""
    footnotes: list[str] = []

    def cell(row: Row, c: Cell) -> str:
        if not c.error:
            return c.text(row)[:CELL_CHARS]
        if c.error not in footnotes:
            footnotes.append(c.error)
        return f"{'error' if c.measured else 'n/m'} [{footnotes.index(c.error) + 1}]"

    lines = table(["operation", "unit", *(r.name for r in results), "tierfs/best peer"],
                  _table(table_rows, results, cell))
    return lines + [f"[{number}] {error}" for number, error in enumerate(footnotes, 1)]


def format_markdown(table_rows: list[Row], results: list[SystemResult], appends: int) -> list[str]:
    """The same table in Markdown (errors whole in their cells), for docs/PERFORMANCE.md."""
    cells = _table(table_rows, results, lambda row, c: c.text(row).replace("|", "\\|"))
    return ["| operation | unit | " + " | ".join(r.name for r in results) + " | tierfs / best peer |",
            "|---|---|" + "---:|" * len(results) + "---:|",
            *("| " + " | ".join([line[0].strip(), *line[1:]]) + " |" for line in cells),
            "| what fsync promised | | " + " | ".join(r.fsync_summary(appends) for r in results) + " | |"]


def format_traffic(table_rows: list[Row], results: list[SystemResult]) -> list[str]:
    """Requests and MiB up/down through the counting proxy, per operation and system."""
    labels = {row.key: row.label.strip() for row in table_rows} | {"prepare": "set-up (write/upload the cold file)"}

    def describe(traffic: Traffic | None) -> str:
        if traffic is None:
            return "-"
        methods = ",".join(f"{m}{t.requests}" for m, t in sorted(traffic.items()) if t.requests)
        return f"{methods or '0 req'} {total(traffic).bytes_up / MiB:.1f}/{total(traffic).bytes_down / MiB:.1f}"

    return table(["S3 traffic (requests, MiB up/down)", *(r.name for r in results)],
                 [[labels[key], *(describe(r.traffic.get(key)) for r in results)] for key in TRAFFIC_ORDER])


def small_files_bound(results: list[SystemResult]) -> str:
    """The small-file row's bound, from the floors measured in the same run."""
    rate = {r.name: c.value for r in results for c in [r.cells.get("create")] if c is not None and c.ok and c.value}
    peers = {name: value for name, value in rate.items() if name not in NOT_PEERS}
    floor, tierfs = rate.get(PD_FLOOR), rate.get("tierfs")
    if floor is None or not peers:
        return f"small files, the bound: not measured (needs {PD_FLOOR} and a peer in the same run)"
    best = max(peers, key=lambda name: peers[name] or 0.0)
    best_rate = peers[best] or 1.0
    text = (f"small files, the bound: {PD_FLOOR} (a pyfuse3 filesystem doing the disk work of tierfs's pd promise "
            f"per file and nothing else: one sync) {floor:,.0f} files/s = {floor / best_rate:.2f}x the best peer "
            f"({best} {best_rate:,.0f})")
    if rate.get(FLOOR):
        text += f"; without the disk work {rate[FLOOR]:,.0f} files/s = {(rate[FLOOR] or 0.0) / best_rate:.2f}x"
    return text + (f"; tierfs = {tierfs / floor:.2f}x the pd floor" if tierfs is not None else "")


class SystemRun:
    """One system's column: each step's cells (or its error) and S3 traffic until it died down."""

    def __init__(self, system: mounts.System, proxy: CountingProxy, args: argparse.Namespace, payload_file: Path) -> None:
        self.system, self.proxy, self.args, self.payload_file = system, proxy, args, payload_file
        self.payload = payload_file.read_bytes()
        self.result = SystemResult(system.name, system.fsync_mechanism, system.cache_emptying)
        self.created = 0

    def step(self, traffic_key: str, keys: tuple[str, ...], action: Callable[[], dict[str, Cell]]) -> bool:
        """``action`` under the watchdog (mounted again if a hang killed it); an error is every key's."""
        say(f"[{self.system.name}] {traffic_key} ...")
        before, hung = self.proxy.snapshot(), [False]
        try:
            if traffic_key != "prepare" and not self.system.is_mounted():
                self.result.notes.append(f"mounted again before {traffic_key}")
                self.system.mount()
            with ops.watchdog(self.system.kill) as hung:
                self.result.cells.update(action())
            succeeded = True
        except (OSError, RuntimeError) as e:
            text = str(e) if isinstance(e, ops.OperationError) else f"{type(e).__name__}: {e}"
            if hung[0]:
                text = f"hung: still running after {ops.HANG_S:g} s, {self.system.name} killed ({text})"
            self.result.cells.update({key: Cell.failed(text) for key in keys if key not in self.result.cells})
            succeeded = False
        if not ops.wait_idle(self.proxy.snapshot):
            self.result.notes.append(f"{traffic_key}: S3 traffic had not died down after {ops.SETTLE_TIMEOUT_S:g} s")
        self.result.traffic[traffic_key] = traffic_difference(self.proxy.snapshot(), before)
        return succeeded

    def mount_cold(self, keys: tuple[str, ...]) -> bool:
        """Unmount, empty the caches, mount; on an error every key gets it."""
        try:
            self.system.mount_cold()
        except (OSError, RuntimeError) as e:
            self.result.cells.update({key: Cell.failed(f"cold mount failed: {e}") for key in keys})
            return False
        note = f"{PAGE_CACHE_KEPT}: {self.system.page_cache_note}"
        if self.system.page_cache_note and note not in self.result.notes:
            self.result.notes.append(note)
        return True

    def run(self, keys: list[str]) -> SystemResult:
        system = self.system
        try:
            if system.small_files_only:
                if self.step("prepare", tuple(keys), self.mount_only):
                    self.step("create", ("create", "create_cpu"), self.create)
                for key in keys:
                    self.result.cells.setdefault(key, Cell(error="a floor for the small-file step only", measured=False))
                return self.result
            if not self.step("prepare", tuple(keys), self.prepare):
                return self.result
            if self.mount_cold(("cold_read", "warm_read", "random_warm")):
                if self.step("cold_read", ("cold_read", "warm_read"), lambda: self.sequential("cold_read")):
                    self.step("warm_read", ("warm_read",), lambda: self.sequential("warm_read"))
                self.step("random_warm", ("random_warm",), lambda: self.random(distinct=False))
            if self.mount_cold(("random_cold", "random_cold_total")):
                self.step("random_cold", ("random_cold", "random_cold_total"), lambda: self.random(distinct=True))
            self.step("appends", ("appends", "append_up", "append_down", "fsync_s3"), self.appends)
            self.step("tail", ("tail",), lambda: {"tail": Cell(percentile(sorted(ops.tail_latencies(
                system.path(TAIL_FILE), self.args.tail_lines, SEED)), 0.5) * 1e3)})
            self.step("create", ("create", "create_cpu"), self.create)
            if self.mount_cold(("ls_fresh", "ls_again")) and self.created and self.step(
                    "ls_fresh", ("ls_fresh",), lambda: self.ls("ls_fresh")):
                self.step("ls_again", ("ls_again",), lambda: self.ls("ls_again"))
            for key in ("ls_fresh", "ls_again"):
                self.result.cells.setdefault(key, Cell.failed("no files were created"))
        finally:
            try:
                system.unmount()
            except (OSError, RuntimeError) as e:
                self.result.notes.append(f"unmount: {e}")
        return self.result

    def mount_only(self) -> dict[str, Cell]:
        """A floor's set-up: no bucket, no cold file."""
        self.system.mount()
        return {}

    def prepare(self) -> dict[str, Cell]:
        self.system.create_bucket()
        self.system.mount()
        self.system.prepare_cold_file(COLD_FILE, self.payload_file)
        return {}

    def ls(self, key: str) -> dict[str, Cell]:
        return {key: Cell(ops.list_long(self.system.path(SMALL_DIR), self.created))}

    def sequential(self, key: str) -> dict[str, Cell]:
        """MB/s of ``dd bs=1M`` of the cold file; fails unless dd copied all of it."""
        if (result := dd(self.system.path(COLD_FILE), "/dev/null")).nbytes != len(self.payload):
            raise ops.OperationError(f"dd read {result.nbytes} bytes, not {len(self.payload)}")
        return {key: Cell(result.mb_per_s)}

    def random(self, distinct: bool) -> dict[str, Cell]:
        """p50; on a fresh mount (``distinct`` blocks) also the total: a whole-file fetch shows."""
        seconds = ops.random_reads(self.system.path(COLD_FILE), self.payload, self.args.random_reads, SEED + distinct,
                                   distinct)
        p50 = Cell(percentile(sorted(seconds), 0.5) * 1e3)
        return {"random_cold": p50, "random_cold_total": Cell(sum(seconds))} if distinct else {"random_warm": p50}

    def appends(self) -> dict[str, Cell]:
        system, before = self.system, self.proxy.snapshot()
        run = ops.appends(system.path(APPEND_FILE), self.args.appends, lambda: system.bytes_in_s3(APPEND_FILE))
        cells = {"appends": Cell(run.rate), "fsync_s3": Cell(run.in_s3_at_last_fsync / MiB)}
        if not system.has_s3:
            return cells | {"append_up": Cell(0.0), "append_down": Cell(0.0), "fsync_s3": Cell(0.0, NO_S3)}
        expected = run.appended * ops.APPEND_BYTES
        try:
            waited = ops.settle(self.proxy.snapshot, system.settle_min_s,
                                lambda: system.bytes_in_s3(APPEND_FILE) >= expected)
            self.result.notes.append(f"appends: all {expected / MiB:.2f} MiB in S3 {waited:.1f} s after the close")
        except ops.OperationError as e:
            return cells | {key: Cell.failed(f"the appended bytes did not all reach S3: {e}")
                            for key in ("append_up", "append_down")}
        moved = total(traffic_difference(self.proxy.snapshot(), before))
        return cells | {"append_up": Cell(moved.bytes_up / MiB), "append_down": Cell(moved.bytes_down / MiB)}

    def create(self) -> dict[str, Cell]:
        directory, pid = self.system.path(SMALL_DIR), self.system.process_id()
        directory.mkdir()
        cpu_before_s = procfs.cpu_s(pid)
        seconds = ops.create_small_files(directory, self.args.small_files)
        cpu_s, count = procfs.cpu_s(pid) - cpu_before_s, self.args.small_files
        self.created = count
        cpu = Cell(cpu_s * 1e3 / count) if pid is not None else Cell(
            error="no process of its own: the kernel's filesystem", measured=False)
        try:
            ops.settle(self.proxy.snapshot, self.system.settle_min_s, lambda: not self.system.uploads_pending())
        except ops.OperationError as e:
            self.result.notes.append(f"small files: {e}")
        return {"create": Cell(count / seconds), "create_cpu": cpu}


def measure(directory: Path, args: argparse.Namespace) -> Report:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise UsageError(f"--systems: choose from {', '.join(SYSTEMS)}")
    require()
    size, keys = args.size_mib * MiB, [r.key for r in rows(args.size_mib, args.small_files, args.appends, 0)]
    unavailable = mounts.install_peers({SYSTEMS[s].program for s in systems if SYSTEMS[s].program})
    payload_file = directory / "payload.bin"
    payload_file.write_bytes(make_payload(size, SEED))
    results: list[SystemResult] = []
    with s3_server(directory / "s3", bucket=None) as endpoint, \
            CountingProxy(endpoint.url, directory / "proxy.log") as proxy:
        for name in systems:
            system = SYSTEMS[name](directory, endpoint, proxy.url, size)
            if system.program in unavailable:
                results.append(SystemResult(name, "", system.cache_emptying,
                                            {key: Cell.failed(unavailable[system.program]) for key in keys}))
                continue
            system.drop_page_cache = not args.keep_page_cache
            results.append(SystemRun(system, proxy, args, payload_file).run(keys))
    return report(results, mounts.peer_versions(), args)


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
                [*format_table(table_rows, results), small_files_bound(results)],
                facts + (["notes:", *notes] if notes else []), format_traffic(table_rows, results)]
    if args.markdown:
        sections.append(format_markdown(table_rows, results, args.appends))
    title = "Peers benchmark: S3 = s3rver 3.7.1 on 127.0.0.1 behind a counting proxy; tierfs durability pd"
    return Report(title, sections, [], {
        "rows": [dataclasses.asdict(row) | {"ratio_tierfs_best_peer": ratio(row, results)} for row in table_rows],
        "systems": {r.name: dataclasses.asdict(r) for r in results}, "versions": versions})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option, default, what in (("--size-mib", 256, "MiB of the file read cold and warm"),
                                  ("--small-files", 10_000, "small files created and listed"),
                                  ("--appends", 2_000, "4 KiB appends, each fsync'd"),
                                  ("--random-reads", 100, "4 KiB preads per random-read row"),
                                  ("--tail-lines", 20, "lines whose tail -f latency is measured")):
        parser.add_argument(option, type=positive, default=default, help=f"{what} (default {default:,})")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)} "
                        f"(default: all; {CEILING}, {FLOOR} and {PD_FLOOR}: ceiling and floors, never peers)")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the kernel page cache before cold mounts (quick checks only: the cold rows "
                        "may then be served partly from RAM, s3rver's files included)")
    parser.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
