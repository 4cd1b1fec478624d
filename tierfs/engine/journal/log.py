"""Tier-1 journal: CRC-framed append records in rolling local files, group commit.

The frame format is in ``journal.frames``, the recovery scan in ``journal.scan``, the
sync rounds in ``journal.aio`` (native AIO) or ``journal.sync_thread`` (a thread, and the waiters).

Invariants:
- Frames are written in LSN order by one writer (this object, on the event loop), so a
  file is always a prefix of valid frames followed at most by one torn frame.
- ``durable_lsn`` only advances after fdatasync of every file holding bytes below it,
  and of the directory for files created since the last sync.
- Group commit, pipelined: the frames queued by the tasks of one scheduler batch go out
  in one write(2) (the journal's writer task runs after them), and the next fdatasync
  starts the moment the previous one completes, covering everything written meanwhile.
  One round is in flight at a time, and one is in flight whenever written bytes were
  asked to become durable and are not yet.
- write(2) happens on the event loop: it copies into the page cache (microseconds for a
  batch) and keeping it on one thread keeps frame order trivially right; fdatasync, which
  waits for the disk, never does: the kernel's AIO worker, the sync thread or a worker
  thread runs it.
- A waiter is woken once the durable LSN reaches its frame, not once per round.
- Space (``journal.space``): a frame is queued only once its blocks are reserved, so a
  full disk refuses the append with ``NoSpaceError`` before anything changed, and the
  next append retries. A write(2) that still hits ENOSPC (a file system without
  fallocate) is cut back to the last whole frame and *stalls* the journal: its frames
  stay queued, in order, and are written by a retry once space is back; their appenders
  wait (nothing of them was acknowledged, nor refused: a refusal would be a lie once
  they land), every new frame is refused with ``NoSpaceError`` meanwhile, and ``sync``
  fails with it. The current file rolls early once ``RECLAIM_AFTER_BYTES`` of it are
  flushed, so the journal holds at most the unflushed bytes plus one file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from tierfs.contracts.errors import JournalCorruptionError, NoSpaceError
from tierfs.engine.clock import monotonic_s
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.journal.aio import AioFdatasync, AioRounds
from tierfs.engine.journal.frames import (
    FRAME_OVERHEAD,
    TailEntryLike,
    create_frame_bytes,
    encode_append_header,
    encode_create,
    file_name,
    list_files,
    read_entries,
    read_range,
    write_all,
)
from tierfs.engine.journal.rounds import LsnWaiters, SyncJob
from tierfs.engine.journal.space import RECLAIM_AFTER_BYTES, SpaceReserver
from tierfs.engine.journal.sync_thread import SyncThread
from tierfs.engine.space_reserve import SpaceReserve, is_no_space

log = logging.getLogger(__name__)

# Split the appenders one round woke into two rounds only from this many on: with fewer,
# a round of one frame costs the disk nearly a whole sync for little overlap.
SPLIT_MIN_WAITERS = 4
# A stalled write (ENOSPC without fallocate) is retried after this, doubling up to the max.
STALL_RETRY_FIRST_S = 0.05
STALL_RETRY_MAX_S = 1.0


class Journal:
    """The open journal of one store: appends frames, syncs them, rolls files.
    ``on_durable(lsn)`` runs on the event loop each time ``durable_lsn`` advances,
    before any waiter is woken."""

    def __init__(
        self,
        directory: Path,
        *,
        start_lsn: int,
        next_seq: int,
        file_bytes: int,
        vd_sync_interval_s: float,
        on_durable: Callable[[int], None],
        space_reserve: SpaceReserve | None = None,
    ) -> None:
        self.directory = directory
        self._file_bytes = file_bytes
        self._vd_sync_interval_s = vd_sync_interval_s
        self._on_durable = on_durable
        self._next_seq = next_seq
        self._files: list[tuple[int, Path]] = list_files(directory)
        self.written_lsn = start_lsn  # bytes handed to write(2)
        self.durable_lsn = start_lsn  # bytes covered by a completed fdatasync
        self._queued: list[bytes] = []  # frame headers and append data, in order
        self._queued_bytes = 0
        self._fd = -1
        self._file_start_lsn = start_lsn
        self._unsynced_fds: list[int] = []  # rolled files not yet fdatasynced
        self._directory_dirty = False
        self._first_unsynced_write_s: float | None = None
        # Held while the files being written change (roll) and while the sync thread
        # snapshots them, so a round never sees a half-rolled journal.
        self._files_lock = threading.Lock()
        self._syncer: SyncThread | AioRounds | None = None
        self._sync_wanted_early = False  # asked for before run() started the thread
        self._writer_task: trio.lowlevel.Task | None = None  # parked until frames wait
        self._waiters = LsnWaiters()
        # After a round that left the disk idle: the frame of the appender that brings
        # the count to zero starts the next round at once (see ``_on_sync_report``).
        self._split_countdown = 0
        self._wakeup = trio.Event()  # the first unsynced write: starts the VD timer
        self._vd_timer_idle = True  # it waits for that wake-up, with no deadline
        self._closed = False
        self._failure: BaseException | None = None
        self._stall: trio.Event | None = None  # set, and dropped, once the stalled write went out
        self._stall_begun = trio.Event()  # wakes the retry task
        self.syncs = 0  # sync rounds completed
        self.sync_backend = ""  # "aio" or "thread" while run() runs
        self.sync_busy_s = 0.0  # time sync rounds were in flight, summed (run() rounds)
        self._busy_before_thread = 0.0
        self._syncs_before_thread = 0
        self._space = SpaceReserver(directory, space_reserve)
        self._open_file(start_lsn)

    # ----------------------------------------------------------------- writing
    def _open_file(self, start_lsn: int) -> None:
        path = self.directory / file_name(start_lsn)
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except OSError as e:
            if is_no_space(e):  # no inode or directory block left: keep the current file
                raise NoSpaceError(str(self.directory), 4096) from e
            raise
        self._space.new_file()
        self._file_start_lsn = start_lsn
        self._files.append((start_lsn, path))
        self._directory_dirty = True

    def _roll(self) -> None:
        """Start a new file at ``written_lsn`` (nothing is queued); the old one is
        synced and closed by the next round, and its unused reservation is given back
        before that round can see it."""
        with self._files_lock:
            old_fd = self._fd
            self._open_file(self.written_lsn)
            self._space.release(old_fd, os.fstat(old_fd).st_size)
            self._unsynced_fds.append(old_fd)

    def roll_for_reclaim(self, checkpoint_lsn: int) -> bool:
        """Roll early when the current file holds enough flushed bytes (below
        ``checkpoint_lsn``) that deleting it once the rest is flushed is worth a roll."""
        flushed_here = min(checkpoint_lsn, self.written_lsn) - self._file_start_lsn
        if self._queued or self._failure is not None or self._closed:
            return False
        if flushed_here < min(self._file_bytes, RECLAIM_AFTER_BYTES):
            return False
        try:
            self._roll()
        except NoSpaceError:
            return False  # keep writing the current file; retried after the next flush
        self._request_sync(force=True)  # the round closes the old file: a deleted file's
        return True  # space is given back only once no descriptor holds it

    def add_append(self, segment_id: int, offset: int, data: bytes, wall_ns: int = 0,
                   writer: int = 0, writer_seq: int = 0) -> tuple[int, int]:
        """Queue an append frame (with the durable LSN of now: ``journal.frames``); return
        (LSN of the frame, LSN just past it), or raise ``NoSpaceError``, nothing queued."""
        seq, frame_lsn, end_lsn = self._place(FRAME_OVERHEAD + len(data))
        self._queued += (encode_append_header(seq, segment_id, offset, data, wall_ns, self.durable_lsn,
                                              writer, writer_seq), data)
        return frame_lsn, end_lsn

    def add_create(self, segment_id: int, name: str, record: bytes) -> int:
        """Queue a create frame (``encode_create``); return the LSN just past it."""
        encoded_name = name.encode()
        seq, _, end_lsn = self._place(create_frame_bytes(encoded_name, record))
        self._queued.append(encode_create(seq, segment_id, encoded_name, record))
        return end_lsn

    def make_room(self, frame_bytes: int) -> None:
        """Roll a full file and reserve room for the next frame (of at most ``frame_bytes``,
        queued in the same step), or raise ``NoSpaceError``, nothing changed."""
        if self._failure is not None:
            raise JournalCorruptionError(f"journal write failed earlier: {self._failure}")
        if self._stall is not None:
            raise NoSpaceError(str(self.directory), self._queued_bytes + frame_bytes)
        queued_bytes = self._queued_bytes  # 0 exactly when nothing is queued
        if not queued_bytes and self.written_lsn - self._file_start_lsn >= self._file_bytes:
            self._roll()
        end_in_file = self.written_lsn + queued_bytes + frame_bytes - self._file_start_lsn
        if end_in_file > self._space.reserved_end_bytes:  # once per MiB
            self._space.ensure(self._fd, end_in_file)

    def _place(self, frame_bytes: int) -> tuple[int, int, int]:
        """(seq, LSN, end LSN) of the next frame, counted as queued: the caller queues it."""
        self.make_room(frame_bytes)
        frame_lsn = self.written_lsn + self._queued_bytes
        end_lsn = frame_lsn + frame_bytes
        seq = self._next_seq
        self._next_seq = seq + 1
        self._queued_bytes = end_lsn - self.written_lsn
        return seq, frame_lsn, end_lsn

    def write_queued(self, *, arm_vd_timer: bool = True) -> bool:
        """write(2) every queued frame in one call; the bytes arm the VD interval timer,
        unless the caller is a round covering them. False: the disk is full and the
        frames stay queued (the journal stalls, see the module docstring)."""
        if not self._queued:
            return True
        pieces, total = self._queued, self._queued_bytes
        try:
            write_all(self._fd, pieces, total)
        except OSError as e:
            # the torn bytes are cut back so the file still ends on a whole frame
            try:
                os.ftruncate(self._fd, self.written_lsn - self._file_start_lsn)
                cut = True
            except OSError:
                cut = False  # recovery cuts the torn frame instead
            if cut and is_no_space(e):
                if self._stall is None:
                    log.warning("journal disk full: %d bytes of frames wait for space (new appends refused)",
                                total)
                    self._stall = trio.Event()
                    self._stall_begun.set()
                return False
            # A journal that cannot be written cannot acknowledge anything again.
            self._queued, self._queued_bytes = [], 0
            self._failure = e
            self._end_stall()
            raise
        self._queued, self._queued_bytes = [], 0
        self.written_lsn += total
        if self._stall is not None:
            log.warning("journal disk has space again: the waiting frames are written")
            self._end_stall()
        if arm_vd_timer and self._first_unsynced_write_s is None:
            self._first_unsynced_write_s = monotonic_s()
            if self._vd_timer_idle:
                self._wakeup.set()  # start the VD interval timer (else it wakes at its deadline)
        return True

    def _end_stall(self) -> None:
        stall, self._stall = self._stall, None
        if stall is not None:
            stall.set()

    async def wait_written(self, lsn: int) -> None:
        """Wait until every byte below ``lsn`` is handed to write(2) (VD acknowledgement;
        only a stalled journal makes anyone wait)."""
        while self.written_lsn < lsn:
            if self._failure is not None:
                raise JournalCorruptionError(f"journal write failed: {self._failure}")
            if self._closed:
                raise JournalCorruptionError(f"journal closed before LSN {lsn} was written")
            stall = self._stall
            if stall is None:
                self.write_queued()
            else:
                await stall.wait()

    async def _retry_stalled(self) -> None:
        """The retry task: a stalled write goes out again, more rarely the longer the
        disk stays full, until it is written (then its round starts) or fails."""
        while True:
            await self._stall_begun.wait()
            self._stall_begun = trio.Event()
            delay_s = STALL_RETRY_FIRST_S
            while self._stall is not None and not self._closed:
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, STALL_RETRY_MAX_S)
                try:
                    written = self.write_queued(arm_vd_timer=False)
                except OSError:
                    self._waiters.wake_all()  # the journal is failed now: its waiters raise
                    break
                if written:
                    self._request_sync()

    def _request_sync(self, *, force: bool = False, hand_over: bool = False) -> None:
        """Ask the sync thread to make everything written so far durable (``force``: run
        a round even with nothing new written, to sync and close a rolled file;
        ``hand_over``: wait for the thread to start it, see ``SyncThread.request``, and
        take in at once what completed meanwhile)."""
        self._first_unsynced_write_s = None  # the round asked for covers every write
        if self._syncer is None:
            self._sync_wanted_early = True  # run() asks once it has started the thread
        elif self._syncer.request(self.written_lsn, force=force, hand_over=hand_over):
            self._on_sync_report()

    def _write_soon(self) -> None:
        """Have the writer task write the queue after the tasks runnable now have run,
        so the frames of one scheduler batch go out in one write(2)."""
        task = self._writer_task
        if task is not None:
            self._writer_task = None
            trio.lowlevel.reschedule(task)
        elif self._syncer is None:
            self._sync_wanted_early = True  # else the writer is already scheduled

    def _write_now(self) -> None:
        """Write the queue and start its round while the loop still has the rest of a
        batch to run: the disk syncs these frames while the loop runs the others."""
        try:
            self.write_queued(arm_vd_timer=False)
        except OSError:
            self._waiters.wake_all()  # the journal is failed now: its waiters raise
            raise
        self._request_sync(hand_over=True)

    async def wait_durable(self, lsn: int) -> None:
        """Wait until every byte below ``lsn`` is durable (PD acknowledgement)."""
        while self.durable_lsn < lsn:
            if self._failure is not None:
                raise JournalCorruptionError(f"journal sync failed: {self._failure}")
            if self._closed:
                raise JournalCorruptionError(f"journal closed before LSN {lsn} was durable")
            if lsn <= self.written_lsn:
                self._request_sync()
            elif self._split_countdown == 1 or (
                self._syncer is not None and self._syncer.next_round_due(self._queued_bytes)
            ):
                self._split_countdown = 0
                self._write_now()
            else:
                self._split_countdown -= self._split_countdown > 0
                self._write_soon()  # the writer asks for the sync once it has written
            await self._waiters.wait(lsn)

    async def sync(self) -> int:
        """Make everything queued so far durable; returns the durable LSN
        (``NoSpaceError`` while the journal is stalled)."""
        if not self.write_queued():
            raise NoSpaceError(str(self.directory), self._queued_bytes)
        await self.wait_durable(self.written_lsn)
        return self.durable_lsn

    def _sync_files(self, job: SyncJob) -> None:
        """Blocking, in the sync thread: rolled files first, the directory, then the
        current file; only then is anything below ``job.target_lsn`` durable."""
        for fd in job.rolled_fds:
            os.fdatasync(fd)
            os.close(fd)
        if job.directory_dirty:
            fsync_directory(self.directory)
        os.fdatasync(job.current_fd)

    def _take_job(self) -> SyncJob:
        """Under ``_files_lock`` (in the sync thread, or at close): the files and the
        written LSN one round makes durable."""
        fds, self._unsynced_fds = self._unsynced_fds, []
        directory_dirty, self._directory_dirty = self._directory_dirty, False
        return SyncJob(self.written_lsn, fds, self._fd, directory_dirty)

    def _on_sync_report(self) -> None:
        """On the loop, after one or more rounds of the sync thread completed."""
        assert self._syncer is not None
        report = self._syncer.take_report()
        self.syncs = self._syncs_before_thread + report.rounds
        self.sync_busy_s = self._busy_before_thread + report.busy_s
        if report.error is not None:
            if self._failure is None:
                self._failure = report.error
                log.critical("journal fdatasync failed, refusing further appends: %s", report.error)
            self._waiters.wake_all()
        elif report.synced_lsn > self.durable_lsn:
            self.durable_lsn = report.synced_lsn
            self._on_durable(report.synced_lsn)
            woken = self._waiters.wake_through(report.synced_lsn)
            # With no round in flight the disk is idle now: where it gains (``splits_woken``)
            # the first half of the woken appenders start a round as soon as their frames
            # are queued and the rest form the next: disk and loop work side by side.
            split = self._syncer.splits_woken and not self._syncer.in_flight
            self._split_countdown = woken // 2 if split and woken >= SPLIT_MIN_WAITERS else 0

    async def _write_batches(self) -> None:
        """The writer task: woken by a PD waiter whose frame is still queued, it runs
        after the other tasks of that scheduler batch and writes all their frames."""

        def aborted(_: object) -> trio.lowlevel.Abort:
            self._writer_task = None
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            self._writer_task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(aborted)
            if self._failure is not None:
                continue
            try:
                self.write_queued(arm_vd_timer=False)
            except OSError:  # the journal is failed now: its waiters raise
                self._waiters.wake_all()
                continue
            self._request_sync()

    async def _vd_timer(self) -> None:
        """A round when the oldest unsynced write is ``vd_sync_interval_s`` old (rounds
        disarm it); woken only while idle: re-armed before its deadline, it sees it then."""
        while True:
            deadline_s = float("inf")
            if self._first_unsynced_write_s is not None:
                deadline_s = self._first_unsynced_write_s + self._vd_sync_interval_s
            self._vd_timer_idle = deadline_s == float("inf")
            with trio.move_on_at(deadline_s):
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            first = self._first_unsynced_write_s
            if first is not None and monotonic_s() >= first + self._vd_sync_interval_s:
                self._request_sync()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the sync rounds (native AIO, else the sync thread) and the writer task,
        and time the VD bound."""
        self._syncs_before_thread = self.syncs
        self._busy_before_thread = self.sync_busy_s
        aio = await AioFdatasync.open_probed(self._fd)
        try:
            async with trio.open_nursery() as nursery:
                if aio is not None:
                    rounds = AioRounds(
                        aio, lock=self._files_lock, take_job=self._take_job,
                        run_job=self._sync_files, on_report=self._on_sync_report,
                        synced_lsn=self.durable_lsn,
                    )
                    await nursery.start(rounds.run)
                    self._syncer = rounds
                    self.sync_backend = "aio"
                else:
                    await nursery.start(self._own_sync_thread)
                    self.sync_backend = "thread"
                nursery.start_soon(self._write_batches)
                nursery.start_soon(self._vd_timer)
                nursery.start_soon(self._retry_stalled)
                if self._sync_wanted_early or self._queued:
                    self._sync_wanted_early = False
                    self.write_queued(arm_vd_timer=False)
                    self._request_sync()
                task_status.started()
        finally:
            self._syncer = None

    async def _own_sync_thread(self, *, task_status: trio.TaskStatus[None]) -> None:
        exited = trio.Event()
        thread = SyncThread(
            lock=self._files_lock,
            take_job=self._take_job,
            run_job=self._sync_files,
            token=trio.lowlevel.current_trio_token(),
            on_report=self._on_sync_report,
            on_exit=exited.set,
            synced_lsn=self.durable_lsn,
        )
        self._syncer = thread
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                thread.stop()  # the round in flight completes and reports first
                await exited.wait()

    async def close(self) -> None:
        """Sync everything and close the files; the journal accepts nothing after. Call
        after ``run`` has ended (its sync thread is gone); the last round runs in a thread."""
        if self._closed:
            return
        if self._failure is None:
            self.write_queued(arm_vd_timer=False)
            with self._files_lock:
                job = self._take_job()
            if job.target_lsn > self.durable_lsn or job.rolled_fds or job.directory_dirty:
                await trio.to_thread.run_sync(self._sync_files, job)
                self.syncs += 1
                self.durable_lsn = job.target_lsn
                self._on_durable(job.target_lsn)
        self._closed = True
        self._end_stall()  # frames never written: their appenders are told the journal closed
        self._waiters.wake_all()
        for fd in [*self._unsynced_fds, self._fd]:
            os.close(fd)
        self._unsynced_fds = []

    # ----------------------------------------------------------------- reading
    def read_at(self, lsn: int, length: int) -> bytes:
        """Blocking pread of written journal bytes (call from a worker thread)."""
        return read_range(self._files, self.written_lsn, lsn, length)

    def read_entries(self, entries: Sequence[TailEntryLike]) -> list[bytes]:
        """Blocking: tail entries re-read from their frames, CRC-verified (``read_entries``)."""
        return read_entries(self._files, self.written_lsn, entries)

    # ----------------------------------------------------------- truncation
    def deletable_files(self, checkpoint_lsn: int) -> list[Path]:
        """Files wholly below ``checkpoint_lsn`` (never the file being written)."""
        result = []
        for (_, path), (next_start, _) in zip(self._files, self._files[1:], strict=False):
            if next_start <= checkpoint_lsn and next_start <= self._file_start_lsn:
                result.append(path)
        return result

    def forget_files(self, paths: list[Path]) -> None:
        gone = set(paths)
        self._files = [(s, p) for s, p in self._files if p not in gone]

    def file_count(self) -> int:
        return len(self._files)

    def size_bytes(self) -> int:
        if not self._files:
            return 0
        return self.written_lsn - self._files[0][0]
