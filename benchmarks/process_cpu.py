"""CPU seconds spent by this process and its descendants, by kind of process, so a
benchmark can print, in the same run as its figures, where a job's CPU went: s3rver,
the Spark JVM, its Python workers, the tierfs daemon, this process (the driver, and an
in-process ceiling such as s3fs).

Invariants:
- A snapshot sums user + system time from ``/proc/PID/stat`` of every live process in
  the tree under ``root``; for every process but ``root`` it includes its reaped
  children (``cutime``, ``cstime``), so a Python worker that exits within a job still
  counts (under its parent, the PySpark daemon, also a Python worker). The difference
  of two snapshots is then the CPU spent between them, by kind, provided nothing in
  the tree was reaped by ``root`` itself in between (the benchmarks take snapshots
  around one job, inside one session).
- Kinds come from the process's name and ancestry only: ``java`` is the JVM; ``node``
  is s3rver; a Python process below the JVM is a Spark worker; another Python process
  whose command line names tierfs is the daemon.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

JVM = "JVM"
S3RVER = "s3rver"
WORKERS = "Python workers"
DAEMON = "tierfs daemon"
THIS = "this process"
OTHER = "other"
KINDS = (S3RVER, JVM, WORKERS, DAEMON, THIS, OTHER)

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float, float] | None:
    """(name, parent pid, own CPU s, reaped children's CPU s), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1: text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    own = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    reaped = (int(fields[13]) + int(fields[14])) / _TICKS_PER_S
    return name, int(fields[1]), own, reaped


def own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` itself (0.0 when it is gone)."""
    stat = _stat(pid)
    return stat[2] if stat is not None else 0.0


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _live_pids() -> Iterable[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def snapshot(root: int | None = None) -> dict[str, float]:
    """CPU seconds so far of the tree under ``root`` (default: this process), by kind."""
    root = os.getpid() if root is None else root
    stats = {pid: stat for pid in _live_pids() if (stat := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    totals = dict.fromkeys(KINDS, 0.0)
    if root not in stats:
        return totals
    totals[THIS] = stats[root][2]
    stack = [(child, False) for child in children.get(root, [])]
    while stack:
        pid, below_jvm = stack.pop()
        name, _, own, reaped = stats[pid]
        if name == "java":
            kind = JVM
        elif name.startswith("node"):
            kind = S3RVER
        elif name.startswith("python"):
            kind = WORKERS if below_jvm else (DAEMON if "tierfs" in _command_line(pid) else OTHER)
        else:
            kind = OTHER
        totals[kind] += own + reaped
        stack.extend((child, below_jvm or kind == JVM) for child in children.get(pid, []))
    return totals


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by kind between two snapshots (never negative: a process that was
    reaped by ``root`` in between takes its CPU out of the tree)."""
    return {kind: max(0.0, after.get(kind, 0.0) - before.get(kind, 0.0)) for kind in KINDS}


def describe_per_mib(cpu: dict[str, float], nbytes: int, wall_s: float) -> str:
    """``s3rver 2.31, JVM 1.80, ... = 7.10 ms/MiB; 1.52 cores busy`` (kinds with no CPU left out)."""
    mib = nbytes / (1 << 20)
    parts = [f"{kind} {cpu[kind] * 1e3 / mib:.2f}" for kind in KINDS if cpu.get(kind, 0.0) > 0.0]
    total = sum(cpu.values())
    return f"{', '.join(parts) or 'none'} = {total * 1e3 / mib:.2f} ms/MiB; {total / wall_s:.2f} cores busy"
