"""Figures and report of ``benchmarks peers``: one row per operation, one column per
system, the ratio tierfs / best peer per row, what each system's fsync promised, and
the S3 traffic each operation caused.

Invariants:
- A cell is a measured value or the error that stopped the operation, never blank: a
  system that was not run is not a column at all.
- The ratio compares tierfs with the best peer that produced a figure (the highest for
  rates, the lowest for times); a row with no such peer, or a tierfs error, has none.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TextIO

from benchmarks.common import MiB
from benchmarks.peer_floor import FLOOR, PD_FLOOR
from benchmarks.peer_mounts import CEILING
from benchmarks.peer_proxy import Traffic, total

NOT_PEERS = ("tierfs", CEILING, FLOOR, PD_FLOOR)  # never the "best peer"
NO_S3 = "(no S3)"  # the note of a figure that has no S3 side (the local-disk ceiling)
CELL_WIDTH = 17
LABEL_WIDTH = 44
ERROR_CHARS = 400  # an error's text in the footnotes and the markdown table


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
    measured: bool = True  # False: not an error, the system does not do this (``error`` says why)

    @classmethod
    def failed(cls, error: str) -> Cell:
        """An error cell: whitespace folded; a long text keeps its start and its end
        (a process's stderr ends with the error that stopped it)."""
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
        if self.value is None:
            return "?"
        return f"{self.value:,.{row.digits}f}" + (f" {self.note}" if self.note else "")


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
        written = appends * 4096 / MiB
        facts = self.fsync_mechanism
        if held.ok and held.note != NO_S3:
            facts += f"; measured: S3 held {held.value:.3f} of {written:.3f} MiB right after the last fsync"
        elif held.error:
            facts += f"; not measured: {held.error}"
        return facts


def ratio(row: Row, results: list[SystemResult]) -> float | None:
    """tierfs / best peer for ``row`` (None when it does not apply)."""
    if row.higher_is_better is None:
        return None
    tierfs = next((r.cells.get(row.key) for r in results if r.name == "tierfs"), None)
    peers = [c.value for r in results if r.name not in NOT_PEERS for c in [r.cells.get(row.key)]
             if c and c.ok and c.value is not None]
    if tierfs is None or not tierfs.ok or not peers or tierfs.value is None:
        return None
    best = max(peers) if row.higher_is_better else min(peers)
    return tierfs.value / best if best else None


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(table_rows: list[Row], results: list[SystemResult], out: TextIO) -> None:
    """The plain-text table; errors are cut to fit and given whole below it."""
    header = f"{'operation':<{LABEL_WIDTH}} {'unit':<10}" + "".join(f" {r.name:>{CELL_WIDTH}}" for r in results)
    header += f" {'tierfs/best peer':>17}"
    print(header, file=out)
    print("-" * len(header), file=out)
    footnotes: list[str] = []
    for row in table_rows:
        cells = []
        for result in results:
            cell = result.cells.get(row.key, Cell.failed("not measured"))
            if cell.error:
                if cell.error not in footnotes:
                    footnotes.append(cell.error)
                label = "error" if cell.measured else "n/m"
                cells.append(_fit(f"{label} [{footnotes.index(cell.error) + 1}]", CELL_WIDTH))
            else:
                cells.append(_fit(cell.text(row), CELL_WIDTH))
        value = ratio(row, results)
        direction = "" if row.higher_is_better is None else ("(higher wins)" if row.higher_is_better else "(lower wins)")
        shown = f"{value:.2f} {direction}" if value is not None else ("n/a" if direction else "")
        print(f"{_fit(row.label, LABEL_WIDTH):<{LABEL_WIDTH}} {row.unit:<10}"
              + "".join(f" {c:>{CELL_WIDTH}}" for c in cells) + f" {shown:>17}", file=out)
    for number, error in enumerate(footnotes, 1):
        print(f"[{number}] {error}", file=out)


def format_markdown(table_rows: list[Row], results: list[SystemResult], appends: int, out: TextIO) -> None:
    """The same table in Markdown (errors whole in their cells), for docs/PERFORMANCE.md."""
    print("| operation | unit | " + " | ".join(r.name for r in results) + " | tierfs / best peer |", file=out)
    print("|---|---|" + "---:|" * len(results) + "---:|", file=out)
    for row in table_rows:
        cells = [r.cells.get(row.key, Cell.failed("not measured")).text(row).replace("|", "\\|") for r in results]
        value = ratio(row, results)
        shown = f"{value:.2f}" if value is not None else ("" if row.higher_is_better is None else "n/a")
        print(f"| {row.label.strip()} | {row.unit} | " + " | ".join(cells) + f" | {shown} |", file=out)
    print("| what fsync promised | | " + " | ".join(r.fsync_summary(appends) for r in results) + " | |", file=out)


def format_traffic(table_rows: list[Row], results: list[SystemResult], out: TextIO) -> None:
    """Requests and MiB up/down through the counting proxy, per operation and system."""
    width = 26
    print(f"{'S3 traffic (requests, MiB up/down)':<{LABEL_WIDTH}}" + "".join(f" {r.name:>{width}}" for r in results),
          file=out)
    for key, label in traffic_rows(table_rows):
        cells = []
        for result in results:
            traffic = result.traffic.get(key)
            cells.append("-" if traffic is None else describe_traffic(traffic))
        print(f"{_fit(label, LABEL_WIDTH):<{LABEL_WIDTH}}" + "".join(f" {c:>{width}}" for c in cells), file=out)


def traffic_rows(table_rows: list[Row]) -> list[tuple[str, str]]:
    """(traffic key, label) in the order of the run, remounts included."""
    keyed = {row.key: row.label.strip() for row in table_rows}
    order = ["prepare", "remount:cold_read", "cold_read", "warm_read", "random_warm", "remount:random_cold",
             "random_cold", "appends", "tail", "create", "remount:ls_fresh", "ls_fresh", "ls_again"]
    labels = {"prepare": "set-up (write/upload the cold file)"}
    for key in order:
        if key.startswith("remount:"):
            labels[key] = f"unmount + cold mount before: {keyed[key.split(':')[1]]}"
    return [(key, labels.get(key) or keyed[key]) for key in order]


def describe_traffic(traffic: Traffic) -> str:
    all_of = total(traffic)
    methods = ",".join(f"{m}{t.requests}" for m, t in sorted(traffic.items()) if t.requests)
    return f"{methods or '0 req'} {all_of.bytes_up / MiB:.1f}/{all_of.bytes_down / MiB:.1f}"


def results_json(table_rows: list[Row], results: list[SystemResult]) -> dict[str, Any]:
    return {
        "rows": [dataclasses.asdict(row) | {"ratio_tierfs_best_peer": ratio(row, results)} for row in table_rows],
        "systems": {
            r.name: {
                "cells": {k: dataclasses.asdict(c) for k, c in r.cells.items()},
                "traffic": {k: {m: dataclasses.asdict(t) for m, t in v.items()} for k, v in r.traffic.items()},
                "fsync_mechanism": r.fsync_mechanism,
                "cache_emptying": r.cache_emptying,
                "notes": r.notes,
            }
            for r in results
        },
    }
