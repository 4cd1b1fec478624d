"""The soak: many kill -9 cycles of a daemon serving a FUSE mount while an fsspec, a
CLI and a mount appender (``testing/soak_writer.py``) append PD records to one segment.

One cycle: start ``tierfs mount`` (daemon + API + FUSE); check the segment and fsck;
start the three writers; let them append for a random fraction of a second or more;
SIGKILL the daemon; collect every writer's acknowledgements. After the last cycle the
daemon is started once more for the last check, then stopped cleanly.

The check, after every restart: the segment is a sequence of whole record lines; every
acknowledged record is there exactly once; each writer's records appear in sequence
order. Records that were in flight at the kill may be there or not (never torn).

Invariants:
- Every number reported is counted from the segment's bytes and the writers' own
  acknowledgements, never assumed: ``SoakReport.clean`` is the verdict.
- Processes are this run's own (``Mount``, ``Popen``) and are killed by handle.

``python -m tierfs.testing.soak --cycles 100 DIR`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from tierfs.testing.harness import Mount, TierProcess, start_daemon
from tierfs.testing.soak_writer import parse

SEGMENT = "soak/records"
KINDS = ("fsspec", "cli", "fuse")
WRITER_STOP_TIMEOUT_S = 30.0  # writers exit on their first failed append after the kill
UNMOUNT_WAIT_S = 10.0  # fusermount3's auto_unmount removes a dead daemon's mount
CONFIG = (  # small thresholds so flushes, chunk and journal rollover happen every cycle
    "durability = 'pd'\nflush_interval_s = 0.05\nflush_bytes = 16384\nmax_chunk_bytes = 49152\n"
    "max_flush_bytes = 32768\njournal_file_bytes = 32768\n"
)


@dataclasses.dataclass
class SoakReport:
    cycles: int = 0
    acked: int = 0
    records: int = 0  # intact records in the segment at the end (acked + in flight)
    lost: int = 0
    duplicated: int = 0
    torn: int = 0
    out_of_order: int = 0
    fsck_problems: int = 0
    acked_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    duration_s: float = 0.0
    failures: list[str] = dataclasses.field(default_factory=list)

    def fail(self, message: str) -> None:
        if message not in self.failures:
            self.failures.append(message)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.torn or self.out_of_order or self.fsck_problems)


def check_segment(data: bytes, acked: dict[str, int], report: SoakReport) -> None:
    """Count torn, duplicated, out-of-order and lost records of ``data`` against
    ``acked`` (writer -> number of acknowledged records, sequence 0..n-1)."""
    lines = data.split(b"\n")
    report.torn = 0  # the segment holds every record so far: count afresh each time
    if lines[-1]:
        report.torn += 1
        report.fail(f"the segment ends inside a record: {lines[-1][:80]!r}")
    seen: dict[str, list[int]] = {}
    for line in lines[:-1]:
        parsed = parse(line)
        if parsed is None:
            report.torn += 1
            report.fail(f"torn or damaged record: {line[:80]!r}")
            continue
        writer, seq = parsed
        seen.setdefault(writer, []).append(seq)
    report.records = sum(len(seqs) for seqs in seen.values())
    report.duplicated = report.out_of_order = report.lost = 0
    for seqs in seen.values():
        report.duplicated += len(seqs) - len(set(seqs))
        report.out_of_order += sum(1 for before, after in zip(seqs, seqs[1:], strict=False) if after < before)
    for writer, count in acked.items():
        missing = set(range(count)) - set(seen.get(writer, []))
        if missing:
            report.lost += len(missing)
            report.fail(f"{writer}: {len(missing)} acknowledged records missing, e.g. {min(missing)}")


def _verify(process: TierProcess, acked: dict[str, int], report: SoakReport) -> None:
    from tierfs.contracts import operations as ops

    client = process.client()
    try:
        check_segment(client.read(SEGMENT), acked, report)
        client.call(ops.FLUSH, None)  # fsck racing a flush misreports (issue 15 item 7)
        problems = client.call(ops.FSCK).problems
        report.fsck_problems += len(problems)
        report.failures += [f"fsck: {problem}" for problem in problems]
    finally:
        client.close()


def _wait_unmounted(mountpoint: Path) -> None:
    from tierfs.fuse.mount import is_mount_point  # also sees a dead daemon's mount

    deadline = time.monotonic() + UNMOUNT_WAIT_S
    while is_mount_point(mountpoint):
        if time.monotonic() > deadline:
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True)
            return
        time.sleep(0.05)


def _start_writers(directory: Path, mount: Mount, cycle: int) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    writers = []
    for kind in KINDS:
        writer = f"{kind}{cycle}"
        out = directory / f"acks-{writer}.txt"
        with open(out, "wb") as stdout:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tierfs.testing.soak_writer", kind, writer,
                 str(mount.data_dir), SEGMENT, str(mount.mountpoint), str(mount.pid)],
                stdout=stdout, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            )
        writers.append((writer, proc, out))
    return writers


def _collect(writers: list[tuple[str, subprocess.Popen[bytes], Path]], acked: dict[str, int], report: SoakReport) -> None:
    for writer, proc, out in writers:
        try:
            proc.wait(timeout=WRITER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            report.failures.append(f"writer {writer} still ran {WRITER_STOP_TIMEOUT_S:g} s after the kill")
        count = sum(1 for line in out.read_text().splitlines() if line.startswith("ack "))
        acked[writer] = count
        report.acked += count
        kind = writer.rstrip("0123456789")
        report.acked_by_kind[kind] = report.acked_by_kind.get(kind, 0) + count
        out.unlink()


def run_soak(directory: Path, cycles: int, *, seed: int = 1, run_s: tuple[float, float] = (0.5, 2.0)) -> SoakReport:
    """``cycles`` kill -9 cycles in ``directory`` (created); the report of what survived."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    data_dir, mountpoint = directory / "data", directory / "mnt"
    config_file = directory / "soak.toml"
    config_file.write_text(CONFIG)
    log_path = directory / "daemon.log"
    report = SoakReport()
    acked: dict[str, int] = {}
    started = time.monotonic()
    for cycle in range(cycles):
        _wait_unmounted(mountpoint)
        mount = Mount(data_dir, mountpoint, config_file=config_file, log_path=log_path, verbose=False)
        writers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        try:
            if cycle == 0:
                client = mount.client()
                client.create(SEGMENT, "pd", True)
                client.close()
            else:
                _verify(mount, acked, report)
            writers = _start_writers(directory, mount, cycle)
            time.sleep(rng.uniform(*run_s))
        finally:
            mount.kill9()
        _collect(writers, acked, report)
        report.cycles += 1
    _wait_unmounted(mountpoint)
    daemon = start_daemon(data_dir, config_file=config_file, log_path=log_path, verbose=False)
    try:
        _verify(daemon, acked, report)
    finally:
        code, stderr = daemon.stop()
        if code != 0:
            report.failures.append(f"the last daemon exited with {code}: {stderr[-500:]}")
    report.duration_s = round(time.monotonic() - started, 1)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a new directory for the data dir and mount point")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.directory.exists() and any(args.directory.iterdir()):
        parser.error(f"{args.directory} is not empty (the soak starts from nothing)")
    report = run_soak(args.directory, args.cycles, seed=args.seed)
    print(json.dumps({**dataclasses.asdict(report), "clean": report.clean}, indent=1))
    sys.exit(0 if report.clean and not report.failures else 1)


if __name__ == "__main__":
    main()
