"""The faults of a chaos run, one function each: it strikes while the writers write,
heals the world (restarts, repairs, restores as an operator would with the commands
docs/operations.md gives) and tells the ledger what the promise lets the fault take
(``Ledger.forgive``). The runner then checks every acknowledged record.

Each nemesis names the loss path of the data-safety issue it stands for, where there is
one; a problem it finds is reported by the runner with the command that replays it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tierfs.testing.chaos.ledger import GONE, MOVED, Ledger, Record
from tierfs.testing.chaos.world import Host, S3Tier2
from tierfs.testing.harness import Daemon

MAX_RECORD_BYTES = 512  # a ledger record and its frame header, with room to spare
VD_ALLOWANCE_S = 2.0  # a VD append's sync interval plus an fsync on a loaded machine


@dataclasses.dataclass
class Chaos:
    """What every nemesis works on."""

    host: Host
    ledger: Ledger
    rng: random.Random
    root: Path
    vd_sync_interval_s: float
    log: Callable[[str], None]
    problems: list[str]
    pause_writers: Callable[[], None]
    resume_writers: Callable[[], None]
    other_data_dirs: list[Path] = dataclasses.field(default_factory=list)  # zombies' lost+found counts too
    s3: S3Tier2 | None = None
    copies: int = 0
    takeovers: int = 0

    def write_for(self, low_s: float = 0.2, high_s: float = 0.8) -> None:
        time.sleep(self.rng.uniform(low_s, high_s))

    def fail(self, problem: str) -> None:
        self.problems.append(problem)
        self.log(f"PROBLEM: {problem}")


def _young_vd(chaos: Chaos) -> Callable[[Record], bool]:
    now = time.monotonic()
    return lambda r: r.durability == "vd" and r.acked_s is not None and now - r.acked_s < (
        chaos.vd_sync_interval_s + VD_ALLOWANCE_S)


def kill9(chaos: Chaos) -> None:
    """A process crash: PD and tier2 survive, VD older than the sync interval too."""
    chaos.write_for()
    chaos.host.kill9()
    chaos.ledger.forgive(GONE, "VD, younger than the sync interval at a kill -9", _young_vd(chaos))
    _restart_paused(chaos)


def power_loss(chaos: Chaos) -> None:
    """The machine loses power: unsynced writes of the journal and SQLite are gone."""
    layer = chaos.host.lazy
    if layer is None:
        return kill9(chaos)
    chaos.write_for()
    # every process dies with the power: a `tierfs append` that opened the data dir
    # in-process must not go on deleting objects after the cut
    chaos.host.kill_every_user()
    layer.power_cut()
    chaos.ledger.forgive(GONE, "VD, younger than the sync interval at a power loss", _young_vd(chaos))
    _restart_paused(chaos)


def disk_full(chaos: Chaos) -> None:
    """The data dir's disk fills up while writers append (and, half the time, the daemon
    is killed and restarted on the full disk): appends are refused, never acknowledged
    and then lost; once space is back every writer goes on. Nothing is forgiven."""
    layer = chaos.host.lazy
    if layer is None:
        chaos.log("disk_full needs the power-loss layer (FUSE): a kill -9 instead")
        return kill9(chaos)
    chaos.write_for()
    layer.set_full(True)
    try:
        chaos.write_for()
        if chaos.rng.random() < 0.5:
            chaos.host.kill9()
            chaos.ledger.forgive(GONE, "VD, younger than the sync interval at a kill -9", _young_vd(chaos))
            started = chaos.host.cli("ls", "/")  # an open on a full disk: refused or served, never damaged
            chaos.log(f"an open on the full disk exited {started.returncode}")
    finally:
        layer.set_full(False)
    if not chaos.host.running:
        _restart_paused(chaos)
    chaos.write_for()


def copy_beside(chaos: Chaos) -> None:
    """Path 3: a copy of the running data dir (a VM snapshot, a restored backup)
    started beside it must not become an owner."""
    chaos.write_for()
    copy = _copy_data_dir(chaos)
    refused = chaos.host.cli("ls", data_dir=copy)
    if refused.returncode != 5 or b"copy of the one that claimed it" not in refused.stderr:
        chaos.fail(f"a copy of the running data dir opened as an owner (exit {refused.returncode}: "
                   f"{_said(refused)})")
    shutil.rmtree(copy, ignore_errors=True)


def takeover_from_copy(chaos: Chaos) -> None:
    """Paths 3 and 4: a copy made while the owner runs takes over (explicitly) while the
    owner still acknowledges appends, and sweeps orphans at grace 0; the old owner is
    fenced, saves what it never flushed, and its data dir, reopened by taking over
    again, still reads every byte it acknowledged (nothing it references was deleted).
    Every other time (the first included) the writers pause before the takeover, so the
    old owner is idle then (its claim checks slowed down) and the first appends after
    it may meet a zombie that has not looked yet (its defrag and orphan sweep look too)."""
    chaos.write_for()
    copy = _copy_data_dir(chaos)
    chaos.write_for()
    config = chaos.host.config
    idle_zombie = chaos.takeovers % 2 == 0
    chaos.takeovers += 1
    if idle_zombie:
        chaos.pause_writers()
    new_owner = Daemon(copy, ["serve", "--takeover"], config_file=config)
    try:
        _wait_serving(new_owner, copy)
        if idle_zombie:
            chaos.resume_writers()
        chaos.write_for(0.3, 0.6)  # the old owner is fenced meanwhile: appends refused
        gc = chaos.host.cli("gc", data_dir=copy, stdin=None)
        if gc.returncode not in (0, 1):
            chaos.fail(f"gc on the new owner failed: {_said(gc)}")
    finally:
        chaos.pause_writers()
        new_owner.stop()
    chaos.host.kill9()
    chaos.other_data_dirs.append(copy)
    # the old data dir owns tier-2 again: everything it acknowledged reads back (its
    # chunks were kept by the copy's sweep, its unflushed appends replay from its journal)
    chaos.host.start("--takeover")
    chaos.resume_writers()


def gc_and_defrag(chaos: Chaos) -> None:
    """Path 4: defrag and an orphan sweep at grace 0, both during appends."""
    chaos.write_for()
    for segment in sorted(chaos.ledger.segments()):
        if chaos.rng.random() < 0.5:
            chaos.host.cli("defrag", segment)
        done = chaos.host.cli("gc")
        if done.returncode not in (0, 1):
            chaos.fail(f"gc failed: {_said(done)}")


def host_loss(chaos: Chaos) -> None:
    """Path 7: the host and its disk are lost after a flush returned; restore from
    tier-2: every byte whose flush returned, every tier2 append, reads back."""
    chaos.write_for()
    # a flush holds what was acknowledged before it was asked for, not before it returned
    flush_asked_at = time.monotonic()
    flushed = chaos.host.cli("flush")
    if flushed.returncode != 0:
        chaos.fail(f"flush failed: {_said(flushed)}")
        return
    chaos.write_for()
    chaos.host.kill9()
    chaos.pause_writers()  # a writer's own `tierfs append` would start an empty store there
    chaos.ledger.forgive(GONE, "PD/VD acknowledged after the last flush, on a lost disk",
                         lambda r: r.durability != "tier2" and r.acked_s is not None and r.acked_s > flush_asked_at)
    chaos.ledger.lost_found_lost("its data dir was lost")
    chaos.host.remove_data_dir()
    if chaos.host.lazy is not None:
        shutil.rmtree(chaos.host.lazy.backing / "data", ignore_errors=True)
    _restored(chaos, chaos.host.cli("restore", timeout_s=300), "after the host's loss")
    _restart(chaos)


def journal_bit_flip(chaos: Chaos) -> None:
    """Path 5: one flipped bit inside an acknowledged frame with frames after it:
    corruption, not a torn tail. The store refuses; fsck --repair moves the damaged
    frame (and what cannot follow it) to lost+found."""
    chaos.write_for()
    chaos.host.kill9()
    chaos.pause_writers()  # a writer's own `tierfs append` would hold the stopped data dir
    every_file = sorted((chaos.host.data_dir / "journal").glob("*.jnl"))
    files = [f for f in every_file if f.stat().st_size > 4096]
    if not files:
        chaos.host.start()
        chaos.resume_writers()
        return
    target = chaos.rng.choice(files)
    size = target.stat().st_size
    # well before the end: the frames of later sync rounds prove the damaged one was
    # synced (in the last round nothing can tell a bit flip from a torn write)
    position = chaos.rng.randrange(size // 8, size // 2)
    after_flip = target.read_bytes()[max(0, position - MAX_RECORD_BYTES):] + b"".join(
        f.read_bytes() for f in every_file if f.name > target.name)
    with open(target, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ (1 << chaos.rng.randrange(8))]))
        f.flush()
        os.fsync(f.fileno())
    opened = chaos.host.cli("ls")
    chaos.log(f"  bit {position} of {target.name}: the store " + (
        "refused to open" if opened.returncode == 3 else f"opened (exit {opened.returncode}): a torn tail"))
    # the records in or after the damaged frame: in lost+found once repaired, or, where
    # no later frame proves the damaged one was synced (the last sync round), cut as a
    # torn tail; tier2 records are in tier-2 either way
    at_risk = after_flip
    if opened.returncode == 3:
        chaos.ledger.forgive(MOVED, "in or after a damaged journal frame",
                             lambda r: r.durability != "tier2" and r.line in at_risk)
    else:
        chaos.ledger.forgive(GONE, "after a bit flip in the last sync round (a torn write, as far as anything can tell)",
                             lambda r: r.durability != "tier2" and r.line in at_risk)
    if opened.returncode == 3:
        repaired = chaos.host.cli("fsck", "--repair")
        if repaired.returncode not in (0, 3):
            chaos.fail(f"fsck --repair exited {repaired.returncode}: {_said(repaired)}")
    elif opened.returncode != 0:
        chaos.fail(f"after a bit flip the store neither opened nor refused clearly: "
                   f"{_said(opened)}")
    _restart(chaos)


def metadata_damage(chaos: Chaos) -> None:
    """Path 8: ``metadata.sqlite`` overwritten after a kill -9: refused by name, then
    ``tierfs restore`` replays the intact journal: nothing acknowledged is lost."""
    chaos.write_for()
    chaos.host.kill9()
    chaos.pause_writers()  # a writer's own `tierfs append` would hold the stopped data dir
    for name in ("metadata.sqlite", "metadata.sqlite-wal"):
        path = chaos.host.data_dir / name
        if path.exists():
            path.write_bytes(os.urandom(4096) * 4)
    chaos.ledger.forgive(GONE, "VD, younger than the sync interval at a kill -9", _young_vd(chaos))
    refused = chaos.host.cli("ls")
    if refused.returncode != 3 or b"tierfs restore" not in refused.stderr:
        chaos.fail(f"a damaged metadata.sqlite was not refused by name (exit {refused.returncode}): "
                   f"{_said(refused)}")
    _restored(chaos, chaos.host.cli("restore", timeout_s=300), "over damaged metadata")
    _restart(chaos)


def s3_faults(chaos: Chaos) -> None:
    """S3 answers 503 SlowDown, resets connections and stalls, then is unreachable for
    a while; appends go on, flushes catch up, nothing is lost."""
    if chaos.s3 is None:
        return kill9(chaos)
    from tierfs.testing.faults.fault_proxy import Faults

    proxy = chaos.s3.proxy
    proxy.faults = Faults(slowdown_rate=0.2, reset_rate=0.05, stall_rate=0.02, stall_s=1.0)
    chaos.write_for(0.5, 1.0)
    proxy.outage(chaos.rng.uniform(0.5, 2.0))
    chaos.write_for(0.5, 1.5)
    proxy.end_outage()
    proxy.faults = Faults()


def kill_while_opening(chaos: Chaos) -> None:
    """Path 9: commands that open the data dir themselves (no daemon) are killed at
    random points of their open, claim and recovery; the next open must not be refused."""
    import sys

    chaos.write_for()
    chaos.host.kill9()
    chaos.pause_writers()
    chaos.ledger.forgive(GONE, "VD, younger than the sync interval at a kill -9", _young_vd(chaos))
    for _ in range(4):
        argv = [sys.executable, "-m", "tierfs.cli", "--data-dir", str(chaos.host.data_dir), "--config",
                str(chaos.host.config), "ls"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(chaos.rng.uniform(0.05, 1.2))  # the CLI imports, then opens: anywhere in it
        proc.kill()
        proc.wait()
    opened = chaos.host.cli("ls")
    if opened.returncode != 0:
        chaos.fail(f"after kills during opens, the data dir refused its next open (exit {opened.returncode}): "
                   f"{_said(opened)}")
    _restart(chaos)


def lost_answers(chaos: Chaos) -> None:
    """Path 6: two writers append byte-identical records through a connection that loses
    answers after the daemon committed: every append lands exactly once (retries are
    known by writer identity, never by their bytes)."""
    import tempfile
    import threading

    from tierfs.remote.client import TierClient
    from tierfs.remote.remote_store import RemoteStore
    from tierfs.testing.faults.lossy_proxy import AnswerDroppingProxy

    segment = f"chaos/identical-{chaos.copies}"
    chaos.copies += 1
    created = chaos.host.cli("create", "--parents", segment)
    if created.returncode != 0:
        chaos.fail(f"cannot create {segment}: {_said(created)}")
        return
    record, rounds = b"the same record from either writer\n", 20
    acked = [0, 0]
    with tempfile.TemporaryDirectory(prefix="lossy", dir="/tmp") as short, \
            AnswerDroppingProxy(Path(short) / "s.sock", chaos.host.socket, drops=rounds) as proxy:

        def write(index: int) -> None:
            import trio

            store = RemoteStore(TierClient(f"unix://{proxy.listen_path}"))
            try:
                for _ in range(rounds):
                    trio.run(store.append, segment, record)
                    acked[index] += 1
            finally:
                store.client.close()

        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    read = chaos.host.cli("cat", segment)
    count = read.stdout.count(record)
    if count != sum(acked):
        chaos.fail(f"{sum(acked)} identical appends acknowledged through lost answers, {count} in {segment}")


def _restored(chaos: Chaos, done: object, what: str) -> None:
    """A restore's exit is 0, or 3 when all fsck lists is lost+found (kept, not damage)."""

    assert isinstance(done, subprocess.CompletedProcess)
    output = (done.stdout + done.stderr).decode(errors="replace")
    damaged = [line for line in output.splitlines() if line.startswith(("DAMAGED", "NOT RESTORED"))
               and "lost+found" not in line]
    if done.returncode not in (0, 3) or damaged:
        chaos.fail(f"restore {what} exited {done.returncode}: " + "\n".join(damaged or [output[-500:]]))


def _copy_data_dir(chaos: Chaos) -> Path:
    chaos.copies += 1
    copy = chaos.root / f"copy-{chaos.copies}"
    shutil.copytree(chaos.host.data_dir, copy, ignore=shutil.ignore_patterns(
        "LOCK", "*.sock", "metadata.backup.tmp*"), ignore_dangling_symlinks=True)
    return copy


def _wait_serving(daemon: Daemon, data_dir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not daemon._answers_health():
        if daemon.proc.poll() is not None or time.monotonic() > deadline:
            daemon.proc.send_signal(signal.SIGKILL)
            raise RuntimeError(f"the daemon on {data_dir} did not start: {daemon.stderr_tail()}")
        time.sleep(0.05)



def _said(done: subprocess.CompletedProcess[bytes]) -> str:
    """The end of what a command printed on stderr."""
    return done.stderr.decode(errors="replace").strip()[-300:]


def _restart_paused(chaos: Chaos) -> None:
    """While the daemon is down, ``tierfs append`` writers open the data dir in-process
    one after another (a feature); the restart waits for them to pause, or it could lose
    every race for the data dir's lock."""
    chaos.pause_writers()
    _restart(chaos)


def _restart(chaos: Chaos) -> None:
    chaos.host.start()
    chaos.resume_writers()

NEMESES: dict[str, Callable[[Chaos], None]] = {
    "kill9": kill9, "power_loss": power_loss, "disk_full": disk_full, "copy_beside": copy_beside,
    "takeover_from_copy": takeover_from_copy, "gc_and_defrag": gc_and_defrag, "host_loss": host_loss,
    "journal_bit_flip": journal_bit_flip, "metadata_damage": metadata_damage, "s3_faults": s3_faults,
    "lost_answers": lost_answers, "kill_while_opening": kill_while_opening,
}
