"""Figures and report of ``benchmarks peers``: one row per operation, one column per
system, the ratio tierfs / best peer per row, the small-file bound the floors set, and
the S3 traffic each operation caused.

Invariants: a cell is a measured value or the error that stopped the operation, never
blank (a system that was not run is no column at all); the ratio compares tierfs with
the best peer that produced a figure (the highest rate, the lowest time), and a row
with no such peer, or a tierfs error, has none.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from benchmarks.harness.figures import MiB
from benchmarks.peers.mounts import CEILING, FLOOR, PD_FLOOR
from benchmarks.peers.proxy import Traffic, total

NOT_PEERS = ("tierfs", CEILING, FLOOR, PD_FLOOR)  # never the "best peer"
NO_S3 = "(no S3)"  # the note of a figure that has no S3 side (the local-disk ceiling)
ERROR_CHARS = 400
TRAFFIC_ORDER = ["prepare", "remount:cold_read", "cold_read", "warm_read", "random_warm", "remount:random_cold",
                 "random_cold", "appends", "tail", "create", "remount:ls_fresh", "ls_fresh", "ls_again"]


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
    note: str = ""  # shown after the value, e.g. "(1,234 in 600 s)"
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

    @classmethod
    def not_measured(cls, reason: str) -> Cell:
        return cls(error=reason, measured=False)

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


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(table_rows: list[Row], results: list[SystemResult]) -> list[str]:
    """The plain-text table; errors are cut to fit and given whole below it."""
    header = f"{'operation':<44} {'unit':<10}" + "".join(f" {r.name:>17}" for r in results) + f" {'tierfs/best peer':>17}"
    lines, footnotes = [header, "-" * len(header)], []
    for row in table_rows:
        cells = []
        for result in results:
            cell = result.cells.get(row.key, Cell.failed("not measured"))
            if cell.error and cell.error not in footnotes:
                footnotes.append(cell.error)
            cells.append(f"{'error' if cell.measured else 'n/m'} [{footnotes.index(cell.error) + 1}]" if cell.error
                         else cell.text(row))
        value = ratio(row, results)
        direction = "" if row.higher_is_better is None else "(higher wins)" if row.higher_is_better else "(lower wins)"
        shown = f"{value:.2f} {direction}" if value is not None else "n/a" if direction else ""
        lines.append(f"{_fit(row.label, 44):<44} {row.unit:<10}" + "".join(f" {_fit(c, 17):>17}" for c in cells)
                     + f" {shown:>17}")
    return lines + [f"[{number}] {error}" for number, error in enumerate(footnotes, 1)]


def format_markdown(table_rows: list[Row], results: list[SystemResult], appends: int) -> list[str]:
    """The same table in Markdown (errors whole in their cells), for docs/PERFORMANCE.md."""
    lines = ["| operation | unit | " + " | ".join(r.name for r in results) + " | tierfs / best peer |",
             "|---|---|" + "---:|" * len(results) + "---:|"]
    for row in table_rows:
        cells = [r.cells.get(row.key, Cell.failed("not measured")).text(row).replace("|", "\\|") for r in results]
        value = ratio(row, results)
        shown = f"{value:.2f}" if value is not None else "" if row.higher_is_better is None else "n/a"
        lines.append(f"| {row.label.strip()} | {row.unit} | " + " | ".join(cells) + f" | {shown} |")
    return lines + ["| what fsync promised | | " + " | ".join(r.fsync_summary(appends) for r in results) + " | |"]


def format_traffic(table_rows: list[Row], results: list[SystemResult]) -> list[str]:
    """Requests and MiB up/down through the counting proxy, per operation and system."""
    labels = {row.key: row.label.strip() for row in table_rows} | {"prepare": "set-up (write/upload the cold file)"}
    lines = [f"{'S3 traffic (requests, MiB up/down)':<44}" + "".join(f" {r.name:>26}" for r in results)]
    for key in TRAFFIC_ORDER:
        label = (f"unmount + cold mount before: {labels[key.split(':')[1]]}" if key.startswith("remount:")
                 else labels[key])
        cells = ["-" if (t := r.traffic.get(key)) is None else describe_traffic(t) for r in results]
        lines.append(f"{_fit(label, 44):<44}" + "".join(f" {c:>26}" for c in cells))
    return lines


def describe_traffic(traffic: Traffic) -> str:
    all_of = total(traffic)
    methods = ",".join(f"{m}{t.requests}" for m, t in sorted(traffic.items()) if t.requests)
    return f"{methods or '0 req'} {all_of.bytes_up / MiB:.1f}/{all_of.bytes_down / MiB:.1f}"


def results_json(table_rows: list[Row], results: list[SystemResult]) -> dict[str, Any]:
    return {"rows": [dataclasses.asdict(row) | {"ratio_tierfs_best_peer": ratio(row, results)} for row in table_rows],
            "systems": {r.name: dataclasses.asdict(r) for r in results}}


def small_files_bound(results: list[SystemResult]) -> str:
    """The small-file row's bound, from the floors measured in the same run."""
    rate = {r.name: c.value for r in results for c in [r.cells.get("create")] if c is not None and c.ok}
    peers = {name: value for name, value in rate.items() if name not in NOT_PEERS and value}
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
