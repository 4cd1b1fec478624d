"""Sync rounds, as both back-ends run them (``sync_thread.SyncThread``, ``aio.AioRounds``):
what a round does (``SyncJob``), what completed (``SyncReport``), the bookkeeping of
what was asked for, started and made durable (``RoundBook``), and the tasks waiting for
a durable LSN (``LsnWaiters``).

A back-end asks the book whether a request needs a round (``ask``), tells it when a
round starts (``started``) and ends (``finished``), and starts the next one while the
book says one is ``wanted``. The back-ends differ only in where a round runs: a Python
thread, or the kernel's AIO worker watched from the event loop.

Invariants:
- At most one round is in flight; ``covered_lsn`` (the target of the last round
  started) never goes back, and ``synced_lsn`` moves only to the target of a round
  whose fdatasyncs all returned without error.
- A failed round stops the book for good (``stopped``, ``error``): a failed journal
  syncs nothing more, so nothing later is reported durable.
- ``typical_sync_s`` is the smallest recent round time, growing by
  ``TYPICAL_SYNC_GROWTH`` per round so that it follows a disk that became slower.
- Waiters (``LsnWaiters``) are woken only once their LSN is durable (or the journal
  failed or closed), in LSN order, never once per round.
- The book is not locked: the sync thread calls it under its lock, AIO rounds only on
  the event loop.
"""

from __future__ import annotations

import dataclasses
import heapq
import time

import trio

# The typical fdatasync time grows by this factor per round (about x2 in 35 rounds).
TYPICAL_SYNC_GROWTH = 1.02


@dataclasses.dataclass
class SyncJob:
    """One round: fdatasync (and close) ``rolled_fds``, fsync the directory when a
    file was created, fdatasync ``current_fd``; then ``target_lsn`` is durable."""

    target_lsn: int
    rolled_fds: list[int]
    current_fd: int
    directory_dirty: bool


@dataclasses.dataclass
class SyncReport:
    synced_lsn: int  # target of the last round that completed
    rounds: int  # rounds completed since the back-end started
    error: OSError | None
    busy_s: float = 0.0  # time rounds were in flight, summed (the disk's busy time, at most)


class RoundBook:
    """What was asked for, started and made durable, and how long rounds take."""

    def __init__(self, synced_lsn: int) -> None:
        self.requested_lsn = synced_lsn  # the loop asked for everything up to here
        self.forced = False  # a round is wanted even with nothing new (a rolled file)
        self.covered_lsn = synced_lsn  # target of the last round started
        self.synced_lsn = synced_lsn
        self.rounds = 0
        self.busy_s = 0.0
        self.error: OSError | None = None
        self.stopped = False
        self.in_flight = False
        self.round_started_s = 0.0  # time.monotonic() when the round in flight started
        self.typical_sync_s = float("inf")  # none measured yet

    def ask(self, lsn: int, *, force: bool = False) -> bool:
        """Record a request for every byte up to ``lsn`` (``force``: a round even with
        nothing new); True if it needs a round beyond those started."""
        if lsn > self.requested_lsn:
            self.requested_lsn = lsn
        elif not force or self.forced:
            return False
        if force:
            self.forced = True
            return True
        return lsn > self.covered_lsn

    def wanted(self) -> bool:
        """Whether a round should start once none is in flight."""
        return not self.stopped and (self.requested_lsn > self.covered_lsn or self.forced)

    def started(self, job: SyncJob) -> None:
        self.forced = False
        self.covered_lsn = max(job.target_lsn, self.covered_lsn)
        self.in_flight = True
        self.round_started_s = time.monotonic()

    def finished(self, target_lsn: int, error: OSError | None) -> None:
        """The round in flight ended (with ``error``, or ``target_lsn`` is durable)."""
        took_s = time.monotonic() - self.round_started_s  # until it was noticed: at most
        self.typical_sync_s = min(took_s, self.typical_sync_s * TYPICAL_SYNC_GROWTH)
        self.busy_s += took_s
        self.in_flight = False
        if error is None:
            self.synced_lsn = target_lsn
            self.rounds += 1
        else:
            self.error = error
            self.stopped = True

    def report(self) -> SyncReport:
        return SyncReport(self.synced_lsn, self.rounds, self.error, self.busy_s)

    @property
    def in_flight_bytes(self) -> int:
        """Bytes the round in flight makes durable (0 when none is)."""
        return self.covered_lsn - self.synced_lsn if self.in_flight else 0

    def probably_done(self) -> bool:
        """The round in flight has run as long as a typical fdatasync."""
        return time.monotonic() - self.round_started_s >= self.typical_sync_s


class BookedRounds:
    """What both back-ends show the journal of their book: whether a round is in flight,
    the bytes it makes durable, and whether it has probably returned (it has run as long
    as a typical fdatasync)."""

    _book: RoundBook

    @property
    def in_flight(self) -> bool:
        return self._book.in_flight

    @property
    def in_flight_bytes(self) -> int:
        return self._book.in_flight_bytes

    def probably_done(self) -> bool:
        return self._book.probably_done()


class LsnWaiters:
    """Tasks parked until an LSN is durable, woken in LSN order (on the loop)."""

    def __init__(self) -> None:
        self._heap: list[list[object]] = []  # [lsn, arrival, task or None once gone]
        self._arrivals = 0

    async def wait(self, lsn: int) -> None:
        """Park until ``wake_through`` reaches ``lsn`` or ``wake_all``; the caller
        re-checks why it woke."""
        entry: list[object] = [lsn, self._arrivals, trio.lowlevel.current_task()]
        self._arrivals += 1
        heapq.heappush(self._heap, entry)

        def abort(_: object) -> trio.lowlevel.Abort:
            entry[2] = None  # cancelled: skipped when its LSN comes
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def wake_through(self, lsn: int) -> int:
        """Wake every task waiting for an LSN up to ``lsn``; returns how many."""
        heap = self._heap
        reschedule = trio.lowlevel.reschedule
        woken = 0
        while heap and heap[0][0] <= lsn:  # type: ignore[operator]
            task = heapq.heappop(heap)[2]
            if task is not None:
                reschedule(task)  # type: ignore[arg-type]
                woken += 1
        return woken

    def wake_all(self) -> None:
        heap, self._heap = self._heap, []
        for entry in heap:
            if entry[2] is not None:
                trio.lowlevel.reschedule(entry[2])  # type: ignore[arg-type]
