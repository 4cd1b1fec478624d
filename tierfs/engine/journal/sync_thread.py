"""The journal's sync thread, used where native AIO (``journal.aio``) is missing: it
keeps one fdatasync in flight while synced bytes are asked for (its bookkeeping, shared
with the AIO back-end, is ``journal.rounds``).

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
- The thread calls into the loop only through the trio token, and touches the round
  book only under the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from tierfs.engine.journal.rounds import BookedRounds, RoundBook, SyncJob, SyncReport

# The longest the event loop waits for the sync thread to take a round it hands over
# (the thread needs the GIL for a few microseconds to start one): past it the loop goes
# on, and the round starts when the loop next releases the GIL.
HAND_OVER_WAIT_S = 0.001


class SyncThread(BookedRounds):
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
        self._book = RoundBook(synced_lsn)  # under ``lock``
        self._idle = False
        self._report_posted = False
        # Held by the loop while it waits to hand a round over; the thread releases it
        # once it has taken a round reaching _hand_over_lsn (a bare lock: the thread's
        # path from one fdatasync to the next stays short).
        self._hand_over = threading.Lock()
        self._hand_over_lsn: int | None = None
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
            if not self._book.ask(lsn, force=force):
                return False  # asked for already, or the round in flight covers it
            if self._idle:
                self._wake.notify()
            elif not hand_over:
                return False  # it starts this round by itself once the one in flight ends
            if not hand_over:
                return False
            self._hand_over.acquire()  # free: only the loop takes it, and gives it back
            self._hand_over_lsn = lsn
            wait_s = min(HAND_OVER_WAIT_S, 2 * self._book.typical_sync_s + 50e-6)
        taken = self._hand_over.acquire(timeout=wait_s)  # the thread releases it
        with self.lock:
            if taken or self._hand_over_lsn is not None:
                self._hand_over.release()  # ours: re-taken, or never released (timed out)
            self._hand_over_lsn = None
        return True

    def next_round_due(self, queued_bytes: int) -> bool:
        """Should the loop write its queue and hand the round over now (mid-batch)? Yes
        once the round in flight has probably returned and as many bytes are queued as
        it carries: rounds stay even, and the disk does not wait for the batch to end."""
        return self.in_flight and queued_bytes >= self.in_flight_bytes and self.probably_done()

    def take_report(self) -> SyncReport:
        """On the loop, in ``on_report``: what completed so far."""
        with self.lock:
            self._report_posted = False
            return self._book.report()

    def stop(self) -> None:
        """Finish the round in flight, start no other; ``on_exit`` follows."""
        with self.lock:
            self._book.stopped = True
            self._wake.notify()

    # ----------------------------------------------------------- the thread
    def _loop(self) -> None:
        try:
            while True:
                book = self._book
                with self.lock:
                    while not book.wanted():
                        if book.stopped:
                            return
                        self._idle = True
                        self._wake.wait()
                    self._idle = False
                    job = self._take_job()
                    book.started(job)
                    if self._hand_over_lsn is not None and job.target_lsn >= self._hand_over_lsn:
                        self._hand_over_lsn = None
                        self._hand_over.release()
                error: OSError | None = None
                try:
                    self._run_job(job)
                except OSError as e:
                    error = e
                with self.lock:
                    book.finished(job.target_lsn, error)  # timed with the wait for the GIL
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

