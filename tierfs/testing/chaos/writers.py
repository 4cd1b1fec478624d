"""The chaos run's writers: one thread each, appending numbered records to one segment
through one front end, recording every send and acknowledgement in the ledger.

Front ends: ``http`` (the API client, exactly once by writer identity: a record whose
answer was lost, or whose daemon went away, is sent again with the same identity until
it is acknowledged or the writer stops), ``cli`` (one ``tierfs append`` process per
record, acknowledged when it exits 0), ``fsspec`` (a ``tierfs://`` ``ab`` file, one
flush per record) and ``mount`` (``write(2)`` on an ``O_APPEND`` descriptor of the
mounted file; a PD or tier2 write returns once durable).

Every ``ROTATE_EVERY`` acknowledged records a writer goes on in a new segment
(``<segment>.<n>``, created through the API as logs rotate), so creations meet every
fault too; an append refused because its segment is not there (``missing``: a creation a fault
took back, with nothing acknowledged in it) creates the segment anew.

Invariant: a record is acknowledged in the ledger only after its front end said so;
a writer never sends its next record before the last one was acknowledged or given up
(``pause``: a record in doubt stays sent, never acknowledged), nor moves to a new
segment with a record in doubt.
"""

from __future__ import annotations

import abc
import errno
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tierfs.contracts.errors import SegmentNotFoundError, TierFSError
from tierfs.contracts.writers import Writer
from tierfs.testing.chaos.ledger import Ledger, Record

RETRY_PAUSE_S = 0.05
CLI_TIMEOUT_S = 60.0
# a killed daemon's writes are given up soon (a pause waits for them), then sent anew
FSSPEC_RETRY_BUDGET_S = 1.0
IDLE_TIMEOUT_S = 120.0  # a pause waits this long at most for appends in flight
ROTATE_EVERY = 400  # acknowledged records per segment before a writer moves to a new one (about one
# rotation per step among the writers: creations meet every fault, and the store does not fill with segments)


class ChaosWriter(threading.Thread, abc.ABC):
    """Appends records while ``running`` is set (see the module docstring)."""

    front_end = ""

    def __init__(self, ledger: Ledger, segment: str, durability: str, name: str, rng: random.Random,
                 socket: Path, config: Path) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.ledger = ledger
        self.segment = segment
        self._base_segment, self._generation, self._acked_here = segment, 0, 0
        self.durability = durability
        self.writer_name = name
        self.rng = random.Random(rng.random())
        self.socket = socket
        self.config = config  # the host's settings (a CLI run in-process must find its tier-2)
        self.running = threading.Event()
        self.stopped = threading.Event()
        self.seq = 0
        self.errors: list[str] = []
        self.pending: Record | None = None  # sent, not acknowledged yet
        self.busy = False  # set before ``running`` is looked at: a pause waits for it
        self.missing = False  # the last append was refused: no such segment (set by ``append``)

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                self.busy = True
                if not self.running.is_set():
                    self.busy = False
                    self.running.wait(timeout=0.05)
                    continue
                try:
                    if self.pending is None:
                        self.seq += 1
                        self.pending = self.ledger.sent(self.segment, self.writer_name, self.seq, self.durability,
                                                        self.front_end, self.rng.randrange(0, 200))
                    if self.append(self.pending):
                        self.ledger.acked(self.pending)
                        self.pending = None
                        self._acked_here += 1
                        if self._acked_here >= ROTATE_EVERY:
                            self._rotate()
                        continue
                    if self.missing and self._create(self.segment):  # a creation a fault took back
                        self.missing = False
                finally:
                    self.busy = False
                time.sleep(RETRY_PAUSE_S)
        finally:
            self.close()

    @abc.abstractmethod
    def append(self, record: Record) -> bool:
        """Send ``record``; True once acknowledged (False: try again later)."""

    def close(self) -> None:
        pass

    def _rotate(self) -> None:
        """Go on in the next segment once it is created (later again if it could not be)."""
        following = f"{self._base_segment}.{self._generation + 1}"
        if self._create(following):
            self.close()  # the front end's handle on the old segment
            self.segment, self._generation, self._acked_here = following, self._generation + 1, 0

    def _create(self, name: str) -> bool:
        """``name`` exists (created now, or already); False if the daemon did not answer."""
        from tierfs.contracts.errors import SegmentExistsError
        from tierfs.remote.client import TierClient

        try:
            # a paused daemon must not hold the writer longer than its appends would
            client = TierClient(f"unix://{self.socket}", read_timeout_s=5.0, overload_retry_s=1.0)
        except TierFSError:
            return False
        try:
            client.create(name, durability=self.durability, parents=True)
            return True
        except SegmentExistsError:
            return True
        except (TierFSError, OSError):
            return False
        finally:
            client.close()

    def give_up(self) -> None:
        """The record in doubt stays sent and unacknowledged; the next gets a new number."""
        self.pending = None


class WriterGroup:
    """A run's writers, started, paused (every append in flight answered or given up)
    and stopped together."""

    def __init__(self) -> None:
        self.writers: list[ChaosWriter] = []

    def add(self, writer: ChaosWriter) -> None:
        self.writers.append(writer)
        writer.start()

    def resume(self) -> None:
        for writer in self.writers:
            writer.running.set()

    def pause(self) -> None:
        for writer in self.writers:
            writer.running.clear()
        _wait_idle(self.writers)

    def stop(self) -> None:
        for writer in self.writers:
            writer.stopped.set()
        for writer in self.writers:
            writer.join(timeout=IDLE_TIMEOUT_S)


def _wait_idle(writers: Sequence[ChaosWriter]) -> None:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while any(w.busy for w in writers) and time.monotonic() < deadline:
        time.sleep(0.01)


class HttpWriter(ChaosWriter):
    front_end = "http"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._identity = Writer()
        self._client: object = None
        self._current: tuple[bytes, object] | None = None  # the record and its identity

    def append(self, record: Record) -> bool:
        from tierfs.remote.client import TierClient
        from tierfs.remote.exactly_once import BytesPayload, append_exactly_once

        if self._current is None or self._current[0] != record.line:
            self._current = (record.line, self._identity.next())
        try:
            if self._client is None:
                self._client = TierClient(f"unix://{self.socket}")
            assert isinstance(self._client, TierClient)
            append_exactly_once(self._client, self.segment, BytesPayload(record.line), conditional=False,
                                writer=self._current[1], maybe_landed=True, budget_s=1.0)  # type: ignore[arg-type]
            return True
        except (TierFSError, OSError) as e:
            self.missing = isinstance(e, SegmentNotFoundError)
            self._reset(e)
            return False

    def _reset(self, error: BaseException) -> None:
        from tierfs.remote.client import TierClient

        if isinstance(self._client, TierClient):
            self._client.close()
        self._client = None

    def close(self) -> None:
        self._reset(RuntimeError("closed"))


class CliWriter(ChaosWriter):
    front_end = "cli"

    def append(self, record: Record) -> bool:
        data_dir = self.socket.parent
        done = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), "--config",
                               str(self.config), "append", self.segment, "-"], input=record.line,
                              capture_output=True, timeout=CLI_TIMEOUT_S)
        if done.returncode == 0:
            return True
        self.missing = done.stderr.rstrip().endswith(b"(not_found)")
        self.give_up()  # a CLI process that failed may or may not have appended: never sent again
        return False


class FsspecWriter(ChaosWriter):
    front_end = "fsspec"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._file: object = None

    def append(self, record: Record) -> bool:
        from tierfs.fsspec_impl import TierFileSystem

        try:
            if self._file is None:
                fs = TierFileSystem(url=f"unix://{self.socket}", direct_reads=False, skip_instance_cache=True,
                                    retry_budget_s=FSSPEC_RETRY_BUDGET_S)
                self._file = fs.open(self.segment, "ab")
            self._file.write(record.line)  # type: ignore[attr-defined]
            self._file.flush()  # type: ignore[attr-defined]
            return True
        except (TierFSError, OSError, ValueError) as e:
            self.missing = isinstance(e, (SegmentNotFoundError, FileNotFoundError))
            self._drop(e)
            self.give_up()  # the buffer died with the file: its fate is unknown
            return False

    def _drop(self, error: BaseException) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - the daemon is gone; nothing to save here
                pass

    def close(self) -> None:
        self._drop(RuntimeError("closed"))


class MountWriter(ChaosWriter):
    front_end = "mount"

    def __init__(self, *args: object, mount_path: Path, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._path = mount_path
        self._fd = -1

    def append(self, record: Record) -> bool:
        try:
            if self._fd < 0:
                self._fd = os.open(self._path / self.segment, os.O_WRONLY | os.O_APPEND)
            os.write(self._fd, record.line)
            return True
        except OSError as e:
            self.missing = e.errno == errno.ENOENT
            self.close()
            self.give_up()
            return False

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1


FRONT_ENDS: dict[str, type[ChaosWriter]] = {
    "http": HttpWriter, "cli": CliWriter, "fsspec": FsspecWriter,
}
