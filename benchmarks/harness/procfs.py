"""CPU, memory and scheduler figures of processes from ``/proc``, so a benchmark can say
in the same run where its time went.

Invariants: CPU seconds are user + system time, 0.0 for a process that is gone;
``cpu_by_kind`` sums the tree under a root by kind, each process with the children it
reaped (a worker that exits within a job still counts), kinds from the name and ancestry
only: ``java`` the JVM, ``node`` s3rver, Python below the JVM a Spark worker, another
whose command line names tierfs the daemon.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
JVM, S3RVER, WORKERS, DAEMON, THIS, OTHER = (
    "JVM", "s3rver", "Python workers", "tierfs daemon", "this process", "other")
KINDS = (S3RVER, JVM, WORKERS, DAEMON, THIS, OTHER)


def _stat(pid: int | str) -> tuple[str, int, float, float] | None:
    """(name, parent pid, own CPU s, reaped children's CPU s), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (text[text.index("(") + 1: text.rindex(")")], int(fields[1]),
            (int(fields[11]) + int(fields[12])) / TICKS_PER_S, (int(fields[13]) + int(fields[14])) / TICKS_PER_S)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (clock ticks: 10 ms)."""
    stat = _stat(pid) if pid is not None else None
    return stat[2] if stat is not None else 0.0


def self_cpu_s() -> float:
    """The same for this process, all its threads, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_times(path: str = "/proc/thread-self/schedstat") -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of a thread so far, or None."""
    try:
        on_cpu_ns, waiting_ns, _ = Path(path).read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9


def memory_bytes(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (the peak of its own address space) of a process."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    return found


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(value) for value in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICKS_PER_S


def cpu_by_kind(root: int | None = None) -> dict[str, float]:
    """CPU seconds so far of the tree under ``root`` (default: this process), by kind."""
    root = os.getpid() if root is None else root
    stats = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(e)) is not None}
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
        kind = (JVM if name == "java" else S3RVER if name.startswith("node") else OTHER if not name.startswith("python")
                else WORKERS if below_jvm else DAEMON if b"tierfs" in _cmdline(pid) else OTHER)
        totals[kind] += own + reaped
        stack.extend((child, below_jvm or kind == JVM) for child in children.get(pid, []))
    return totals


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds by kind between two ``cpu_by_kind`` snapshots (never negative)."""
    return {kind: max(0.0, after.get(kind, 0.0) - before.get(kind, 0.0)) for kind in KINDS}


def describe_per_mib(cpu: dict[str, float], nbytes: int, wall_s: float) -> str:
    """``s3rver 2.31, JVM 1.80 = 4.11 ms/MiB; 1.52 cores busy`` (kinds with no CPU left out)."""
    mib = nbytes / (1 << 20)
    parts = [f"{kind} {cpu[kind] * 1e3 / mib:.2f}" for kind in KINDS if cpu.get(kind, 0.0) > 0.0]
    total = sum(cpu.values())
    return f"{', '.join(parts) or 'none'} = {total * 1e3 / mib:.2f} ms/MiB; {total / wall_s:.2f} cores busy"
