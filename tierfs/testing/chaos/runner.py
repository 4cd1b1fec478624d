"""One chaos run: a seeded schedule of faults against real daemons while writers on
every front end append, with the ledger checked after every step.

A run, in order:
1. set up the world from the seed: tier-2 (a local directory, or moto's S3 behind the
   fault proxy), the data dir (on the power-loss layer when FUSE is there), one daemon;
   segments of every durability level, each with a writer of some front end;
2. ``steps`` times: let the writers write, strike with a nemesis drawn from the seed
   (``nemeses.NEMESES``), heal; pause the writers, make everything durable, read every
   segment and every lost+found, and check every acknowledged record
   (``Ledger.check``);
3. stop; report the ledger's counts and the problems, each with the command that
   replays the run (``replay_command``).

Invariant: the same seed draws the same world, writers and faults in the same order
(timings differ: the processes are real).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierfs.testing.chaos.ledger import Ledger
from tierfs.testing.chaos.nemeses import NEMESES, Chaos
from tierfs.testing.chaos.world import Host, S3Tier2
from tierfs.testing.chaos.writers import FRONT_ENDS, WriterGroup

if TYPE_CHECKING:
    from tierfs.remote.client import TierClient

SETTINGS = {
    "flush_interval_s": 0.3, "owner_check_interval_s": 0.2, "vd_sync_interval_s": 0.5,
    "orphan_grace_s": 0.0, "orphan_gc_interval_s": 2.0, "defrag_interval_s": 1.0,
    "defrag_min_small_chunks": 4, "offload_deletion_lag_s": 0.0, "max_chunk_bytes": 65536,
    "journal_file_bytes": 262144,
}
DURABILITIES = ("pd", "vd", "tier2")


@dataclasses.dataclass
class RunResult:
    seed: int
    steps: int
    nemeses: list[str]
    problems: list[str]
    summary: dict[str, int]
    replay: str


def replay_command(seed: int, steps: int, nemeses: Sequence[str], s3: bool) -> str:
    names = ",".join(nemeses)
    return (f"{sys.executable} -m tierfs.testing.chaos --seed {seed} --steps {steps} --nemeses {names}"
            + (" --s3" if s3 else ""))


def _fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def run(seed: int, steps: int, root: Path, *, nemeses: Sequence[str] = tuple(NEMESES), s3: bool = False,
        lazy: bool | None = None, writers: int = 4, log: Callable[[str], None] = print,
        in_turn: bool = False) -> RunResult:
    """``in_turn``: the nemeses strike in the order given, not drawn from the seed."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    lazy = _fuse_available() if lazy is None else lazy
    tier2: str | S3Tier2 = S3Tier2(root / "s3", seed) if s3 else str(root / "tier2")
    host = Host(root / "host", tier2, lazy=lazy, settings=SETTINGS)
    ledger = Ledger(f"run{seed}")
    group = WriterGroup()
    problems: list[str] = []
    chaos = Chaos(host, ledger, rng, root, SETTINGS["vd_sync_interval_s"], log, problems, group.pause, group.resume,
                  s3=tier2 if isinstance(tier2, S3Tier2) else None)
    drawn: list[str] = []
    try:
        host.start()
        front_ends = sorted(FRONT_ENDS)
        for index in range(writers):
            durability = DURABILITIES[index % len(DURABILITIES)]
            segment = f"chaos/w{index}-{durability}"
            created = host.cli("create", "--parents", "--durability", durability, segment)
            if created.returncode != 0:
                raise RuntimeError(f"cannot create {segment}: {created.stderr.decode(errors='replace')}")
            kind = FRONT_ENDS[front_ends[rng.randrange(len(front_ends))] if index else "http"]
            group.add(kind(ledger, segment, durability, f"w{index}", rng, host.socket, host.config))
        drawn = run_steps(steps, nemeses, rng, in_turn, log, group, lambda name: NEMESES[name](chaos),
                          lambda step, name: _check(chaos, step, name), problems)
    finally:
        group.stop()
        host.close()
        if isinstance(tier2, S3Tier2):
            tier2.close()
    return RunResult(seed, steps, drawn, problems, ledger.summary(), replay_command(seed, steps, nemeses, s3))


def run_steps(steps: int, nemeses: Sequence[str], rng: random.Random, in_turn: bool, log: Callable[[str], None],
              group: WriterGroup, strike: Callable[[str], None], check: Callable[[int, str], list[str]],
              problems: list[str]) -> list[str]:
    """The writers write; ``steps`` times a nemesis strikes and heals, the writers pause
    and the ledger is checked; the first step with problems ends the run. The nemeses
    drawn, in order (problems go to ``problems``)."""
    drawn: list[str] = []
    group.resume()
    for step in range(1, steps + 1):
        name = nemeses[(step - 1) % len(nemeses)] if in_turn else rng.choice(list(nemeses))
        drawn.append(name)
        log(f"step {step}/{steps}: {name}")
        try:
            strike(name)
        except Exception as e:  # noqa: BLE001 - the world did not heal: report it, with the replay
            problems.append(f"step {step} ({name}): the world did not heal: {type(e).__name__}: {str(e)[-500:]}")
            break
        group.pause()
        problems += check(step, name)
        if problems:
            break
        group.resume()
    group.pause()
    return drawn


def _check(chaos: Chaos, step: int, nemesis: str) -> list[str]:
    """Every acknowledged record against the promise, the store made durable first."""
    host = chaos.host
    with _DaemonOrCli(host) as store:
        not_synced = store.sync()
        if not_synced is not None:
            return [f"after step {step} ({nemesis}): sync failed: {not_synced[-300:]}"]
        segments: dict[str, bytes] = {}
        for name in sorted(chaos.ledger.segments()):
            read = store.cat(name)
            if isinstance(read, str):
                return [f"after step {step} ({nemesis}): cat {name} failed: {read[-300:]}"]
            segments[name] = read
        damage = store.fsck()
    found = [f"after step {step} ({nemesis}): {p}" for p in chaos.ledger.check(
        segments, host.lost_found_bytes(*chaos.other_data_dirs))]
    return found + [f"after step {step} ({nemesis}): {line}" for line in damage]


class _DaemonOrCli:
    """``tierfs sync``, ``cat`` and ``fsck`` for the check: through the daemon's API from
    this process where it answers (a CLI process per segment was most of a check's time;
    the CLI would call the same API), else with the CLI; a failure is the CLI's message."""

    def __init__(self, host: Host) -> None:
        from tierfs.remote.client import TierClient

        self._host = host
        self._client = TierClient(f"unix://{host.socket}") if host.running else None

    def __enter__(self) -> _DaemonOrCli:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._client is not None:
            self._client.close()

    def sync(self) -> str | None:
        """None once every segment is durable, else why not."""
        answered, _ = self._through_daemon(lambda client: client.op("sync"))
        if answered:
            return None
        synced = self._host.cli("sync")
        return None if synced.returncode == 0 else synced.stderr.decode(errors="replace")

    def cat(self, name: str) -> bytes | str:
        """The segment's bytes, or why they could not be read. A segment that does not
        exist reads as empty: a creation a fault took back, which the ledger then judges
        by the records acknowledged in it."""
        from tierfs.contracts.errors import SegmentNotFoundError

        def read_or_empty(client: TierClient) -> bytes:
            try:
                return bytes(client.read(name))
            except SegmentNotFoundError:
                return b""

        answered, data = self._through_daemon(read_or_empty)
        if answered:
            return bytes(data)
        read = self._host.cli("cat", name)
        if read.returncode == 0:
            return read.stdout
        message = read.stderr.decode(errors="replace")
        return b"" if message.rstrip().endswith("(not_found)") else message

    def fsck(self) -> list[str]:
        """``tierfs fsck``: what it found damaged outside lost+found, as its ``DAMAGED``
        lines (lost+found holding something is no problem), or how it failed."""
        from tierfs.contracts.operations import FSCK

        answered, report = self._through_daemon(lambda client: client.call(FSCK))
        if answered:
            lines = [f"DAMAGED {problem}" for problem in report.problems]
        else:
            fsck = self._host.cli("fsck")
            if fsck.returncode not in (0, 3):  # 3: lost+found holds something, or damage (below)
                return [f"fsck exited {fsck.returncode}: {fsck.stderr.decode(errors='replace')[-300:]}"]
            lines = fsck.stdout.decode(errors="replace").splitlines()
        return [f"fsck: {line}" for line in lines if line.startswith("DAMAGED") and "lost+found" not in line]

    def _through_daemon(self, call: Callable[[TierClient], Any]) -> tuple[bool, Any]:
        """(True, the answer) where the daemon answered, else (False, None)."""
        from tierfs.contracts.errors import TierFSError

        if self._client is None:
            return False, None
        try:
            return True, call(self._client)
        except TierFSError:
            return False, None  # the CLI tries, and says why not
