"""The journal's sync thread, used where native AIO (``journal.aio``) is missing: it
keeps one fdatasync in flight while synced bytes are asked for. Also the tasks waiting
for a durable LSN (both backends).

The event loop writes frames (write(2)) and asks for a sync up to what it wrote
(``SyncThread.request``). The thread runs rounds back to back on its own: the moment a
round's fdatasync returns, it reports to the loop (one coalesced ``run_sync_soon``)
and, if more bytes were asked for meanwhile, starts the next round at once, covering
everything written by then. So the disk never waits for the event loop to run the
appenders the previous round woke (a Python thread cannot start a system call while
another holds the GIL: a round that waited for the loop to hand it over would start
only once the loop went idle).

Invariants:
- At most one round is in flight, and rounds run in order; a round covers the bytes
  written before its snapshot (``take_job``, under the lock that file rolling holds),
  so its target is durable once its fdatasyncs (rolled files, the directory, the
  current file) have returned.
- The thread reads no clock and calls into the loop only through the trio token.
- Waiters (``LsnWaiters``) are woken only once ``durable_lsn`` reaches their LSN (or
  the journal failed or closed), never once per round.
"""

from __future__ import annotations

import dataclasses
import heapq
import threading
import time
from collections.abc import Callable

import trio

# The longest the event loop waits for the sync thread to take a round it hands over
# (the thread needs the GIL for a few microseconds to start one): past it the loop goes
# on, and the round starts when the loop next releases the GIL.
HAND_OVER_WAIT_S = 0.001
# The typical fdatasync time is the smallest recent one, growing by this factor per
# round so that it follows a disk that became slower (about x2 in 35 rounds).
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
    rounds: int  # rounds completed since the thread started
    error: OSError | None
    busy_s: float = 0.0  # time rounds were in flight, summed (the disk's busy time, at most)


class SyncThread:
    """One long-lived thread that runs sync rounds back to back while asked for.

    ``splits_woken``: the journal splits the appenders a round woke into two rounds
    when the disk is idle (32 PD writers, this thread: 0.258 against 0.235 of the
    append benchmark's raw (b) without, median of four alternating pairs).

    ``take_job`` (called in the thread, under ``lock``, which the journal holds while it
    rolls a file) snapshots the journal's files and
    written LSN; ``run_job`` does the blocking syncs; ``on_report`` runs on the loop
    (through the token) after one or more rounds completed; ``on_exit`` runs on the loop
    once the thread has ended.
    """

    splits_woken = True  # a property of the backend, see above

    def __init__(
        self,
        *,
        lock: threading.Lock,
        take_job: Callable[[], SyncJob],
        run_job: Callable[[SyncJob], None],
        token: trio.lowlevel.TrioToken,
        on_report: Callable[[], None],
        on_exit: Callable[[], None],
        synced_lsn: int,
    ) -> None:
        self.lock = lock  # the journal holds it too while it rolls a file
        self._wake = threading.Condition(lock)
        self._take_job = take_job
        self._run_job = run_job
        self._token = token
        self._on_report = on_report
        self._on_exit = on_exit
        self._requested_lsn = synced_lsn  # the loop asked for everything up to here
        self._forced = False  # a round is wanted even with nothing new (a rolled file)
        self._covered_lsn = synced_lsn  # target of the last round started
        self._synced_lsn = synced_lsn
        self._rounds = 0
        self._busy_s = 0.0
        self._error: OSError | None = None
        self._idle = False
        self._report_posted = False
        self._stopped = False
        self.in_flight = False  # read on the loop: a round is running
        # Held by the loop while it waits to hand a round over; the thread releases it
        # once it has taken a round reaching _hand_over_lsn (a bare lock: the thread's
        # path from one fdatasync to the next stays short).
        self._hand_over = threading.Lock()
        self._hand_over_lsn: int | None = None
        self._round_started_s = 0.0  # time.monotonic() when the round in flight started
        self._typical_sync_s = float("inf")  # none measured yet; see TYPICAL_SYNC_GROWTH
        self._thread = threading.Thread(target=self._loop, name="tierfs-journal-sync", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- loop side
    def request(self, lsn: int, *, force: bool = False, hand_over: bool = False) -> bool:
        """Ask for every byte written up to ``lsn`` (which must be written) to become
        durable; ``force``: run a round even if nothing new was written.

        ``hand_over``: the loop has more work to run right now and wants this round to
        start now, not when the loop next goes idle; it blocks (without the GIL) until
        the thread has taken the round, at most ``HAND_OVER_WAIT_S`` or about twice a
        typical sync. Only worth it when the thread is idle or its round is
        ``probably_done``: otherwise the loop would wait for the disk. Returns True
        after such a wait: the thread posts no report for a round that completes
        meanwhile, so the caller reads it (``take_report``) right away."""
        with self.lock:
            if lsn > self._requested_lsn:
                self._requested_lsn = lsn
            elif not force or self._forced:
                return False
            if force:
                self._forced = True
            elif lsn <= self._covered_lsn:
                return False  # the round in flight already covers it
            if self._idle:
                self._wake.notify()
            elif not hand_over:
                return False  # it starts this round by itself once the one in flight ends
            if not hand_over:
                return False
            self._hand_over.acquire()  # free: only the loop takes it, and gives it back
            self._hand_over_lsn = lsn
            wait_s = min(HAND_OVER_WAIT_S, 2 * self._typical_sync_s + 50e-6)
        taken = self._hand_over.acquire(timeout=wait_s)  # the thread releases it
        with self.lock:
            if taken or self._hand_over_lsn is not None:
                self._hand_over.release()  # ours: re-taken, or never released (timed out)
            self._hand_over_lsn = None
        return True

    @property
    def in_flight_bytes(self) -> int:
        """Bytes the round in flight makes durable (0 when none is)."""
        return self._covered_lsn - self._synced_lsn if self.in_flight else 0

    def probably_done(self) -> bool:
        """The round in flight has run as long as a typical fdatasync: the thread is
        likely waiting for the GIL to report it and start the next."""
        return time.monotonic() - self._round_started_s >= self._typical_sync_s

    def next_round_due(self, queued_bytes: int) -> bool:
        """Should the loop write its queue and hand the round over now (mid-batch)? Yes
        once the round in flight has probably returned and as many bytes are queued as
        it carries: rounds stay even, and the disk does not wait for the batch to end."""
        return self.in_flight and queued_bytes >= self.in_flight_bytes and self.probably_done()

    def take_report(self) -> SyncReport:
        """On the loop, in ``on_report``: what completed so far."""
        with self.lock:
            self._report_posted = False
            return SyncReport(self._synced_lsn, self._rounds, self._error, self._busy_s)

    def stop(self) -> None:
        """Finish the round in flight, start no other; ``on_exit`` follows."""
        with self.lock:
            self._stopped = True
            self._wake.notify()

    # ----------------------------------------------------------- the thread
    def _wanted(self) -> bool:
        return self._requested_lsn > self._covered_lsn or self._forced

    def _loop(self) -> None:
        try:
            while True:
                with self.lock:
                    while not self._stopped and not self._wanted():
                        self._idle = True
                        self._wake.wait()
                    self._idle = False
                    if self._stopped:
                        return
                    job = self._take_job()
                    self._forced = False
                    self._covered_lsn = max(job.target_lsn, self._covered_lsn)
                    self.in_flight = True
                    if self._hand_over_lsn is not None and job.target_lsn >= self._hand_over_lsn:
                        self._hand_over_lsn = None
                        self._hand_over.release()
                error: OSError | None = None
                self._round_started_s = started_s = time.monotonic()
                try:
                    self._run_job(job)
                except OSError as e:
                    error = e
                took_s = time.monotonic() - started_s  # with the wait for the GIL: an upper bound
                self._typical_sync_s = min(took_s, self._typical_sync_s * TYPICAL_SYNC_GROWTH)
                with self.lock:
                    self.in_flight = False
                    self._busy_s += took_s
                    if error is None:
                        self._synced_lsn = job.target_lsn
                        self._rounds += 1
                    else:
                        self._error = error
                        self._stopped = True  # a failed journal syncs nothing more
                    if self._hand_over_lsn is not None:
                        post = False  # the loop waits to hand a round over: it reads this
                    else:
                        post = not self._report_posted
                        self._report_posted = True
                if post:
                    self._token.run_sync_soon(self._on_report)
        except trio.RunFinishedError:
            return
        finally:
            try:
                self._token.run_sync_soon(self._on_exit)
            except trio.RunFinishedError:
                pass


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
