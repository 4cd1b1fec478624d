"""Tier-1 journal: CRC-framed append records in rolling local files, group commit.

The frame format, file naming and the recovery scan are in ``journal_format``.

Invariants:
- Frames are written in LSN order by one writer (this object, on the event loop), so a
  file is always a prefix of valid frames followed at most by one torn frame.
- ``durable_lsn`` only advances after fdatasync of every file holding bytes below it,
  and of the directory for files created since the last sync.
- Group commit: all frames queued while a sync runs go out in one write(2) and one
  fdatasync in the next round.
- write(2) happens on the event loop: it copies into the page cache (microseconds for a
  batch) and keeping it on one thread keeps frame order trivially right; fdatasync, which
  waits for the disk, always runs in a worker thread.
- Space (``journal_space``): a frame is queued only once its blocks are reserved, so a
  full disk refuses the append with ``NoSpaceError`` before anything changed, and the
  next append retries; a write(2) that still hits ENOSPC (no fallocate) is cut back to
  the last whole frame. The current file rolls early once ``RECLAIM_AFTER_BYTES`` of it
  are flushed, so the journal holds at most the unflushed bytes plus one file.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import DataCorruptionError, JournalCorruptionError, NoSpaceError
from tierfs.engine.clock import monotonic_s
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.journal_format import (
    FRAME_HEADER,
    FRAME_OVERHEAD,
    SEQ,
    TailEntryLike,
    append_header_size,
    encode_append_header,
    file_name,
    list_files,
    write_all,
)
from tierfs.engine.journal_space import RECLAIM_AFTER_BYTES, SpaceReserver
from tierfs.engine.space_reserve import SpaceReserve, is_no_space

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _SyncJob:
    target_lsn: int
    rolled_fds: list[int]
    current_fd: int
    directory_dirty: bool
    error: OSError | None = None


class _SyncThread:
    """One long-lived thread that runs fdatasync jobs and reports back to the trio loop
    through its token: cheaper per round than ``trio.to_thread`` (no limiter, no
    thread hand-off per call), which matters at thousands of rounds per second.

    It reads no clock: the VD interval is timed on the event loop (``Journal.run``),
    because a thread cannot read the trio clock that the loop's timeouts run on."""

    def __init__(
        self,
        sync: Callable[[_SyncJob], None],
        token: trio.lowlevel.TrioToken,
        on_done: Callable[[_SyncJob], None],
    ) -> None:
        self._sync = sync
        self._token = token
        self._on_done = on_done
        self._condition = threading.Condition()
        self._job: _SyncJob | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tierfs-journal-sync", daemon=True)
        self._thread.start()

    def submit(self, job: _SyncJob) -> None:
        with self._condition:
            assert self._job is None, "one sync round at a time"
            self._job = job
            self._condition.notify()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    def _loop(self) -> None:
        while True:
            with self._condition:
                while self._job is None and not self._stopped:
                    self._condition.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                self._sync(job)
            except OSError as e:
                job.error = e
            try:
                self._token.run_sync_soon(self._on_done, job)
            except trio.RunFinishedError:
                return


class Journal:
    """The open journal of one store: appends frames, syncs them, rolls files.

    ``on_durable(lsn)`` is called on the event loop each time ``durable_lsn`` advances,
    before any waiter is woken.
    """

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
        self._sync_requested = False
        self._round_in_flight = False
        self._syncer: _SyncThread | None = None
        self._wakeup = trio.Event()  # a sync was requested, or the first unsynced write
        self._round_done = trio.Event()
        self._closed = False
        self._failure: BaseException | None = None
        self.syncs = 0
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
        synced by the next round, and its unused reservation is given back."""
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
        self.request_sync()  # the round closes the old file: a deleted file's space is
        return True  # given back only once no descriptor holds it

    def add_append(self, segment_id: int, offset: int, data: bytes, wall_ns: int = 0) -> tuple[int, int]:
        """Queue an append frame; return (LSN of the frame, LSN just past it).

        Raises ``NoSpaceError`` (nothing queued) when the disk cannot hold the frame."""
        if self._failure is not None:
            raise JournalCorruptionError(f"journal write failed earlier: {self._failure}")
        if not self._queued and self.written_lsn - self._file_start_lsn >= self._file_bytes:
            self._roll()
        end_in_file = (
            self.written_lsn + self._queued_bytes + FRAME_OVERHEAD + len(data) - self._file_start_lsn
        )
        if end_in_file > self._space.reserved_end_bytes:  # once per MiB: the call is rare
            self._space.ensure(self._fd, end_in_file)
        header = encode_append_header(self._next_seq, segment_id, offset, data, wall_ns)
        self._next_seq += 1
        frame_lsn = self.written_lsn + self._queued_bytes
        self._queued.append(header)
        self._queued.append(data)
        frame_bytes = len(header) + len(data)
        self._queued_bytes += frame_bytes
        return frame_lsn, frame_lsn + frame_bytes

    def write_queued(self, *, arm_vd_timer: bool = True) -> None:
        """write(2) every queued frame in one call (rolling the file first if full).

        Written bytes not yet synced arm the VD interval timer, unless the caller is a
        sync round that covers them anyway."""
        if not self._queued:
            return
        pieces, total = self._queued, self._queued_bytes
        self._queued = []
        self._queued_bytes = 0
        try:
            write_all(self._fd, pieces, total)
        except OSError as e:
            # A journal that cannot be written cannot acknowledge anything again; the
            # torn bytes are cut back so the file still ends on a whole frame.
            self._failure = e
            try:
                os.ftruncate(self._fd, self.written_lsn - self._file_start_lsn)
            except OSError:
                pass  # recovery cuts the torn frame instead
            if is_no_space(e):
                raise NoSpaceError(str(self.directory), total) from e
            raise
        self.written_lsn += total
        if arm_vd_timer and self._first_unsynced_write_s is None:
            self._first_unsynced_write_s = monotonic_s()
            self._wakeup.set()  # start the VD interval timer

    def request_sync(self) -> trio.Event:
        """Ask for a sync round; returns the event set when the next round completes.

        With no round in flight one starts at once (whatever is queued goes out in it);
        otherwise the round starts the moment the one in flight completes, carrying every
        frame queued meanwhile. So the disk syncs one batch while the event loop runs
        the appenders that form the next (pipelined group commit).
        """
        if self._round_in_flight:
            self._sync_requested = True  # the in-flight round's completion starts it
        elif self._syncer is None:
            self._sync_requested = True
            self._wakeup.set()  # run() has not started its thread yet
        else:
            self._start_round()
        return self._round_done

    async def wait_durable(self, lsn: int) -> None:
        while self.durable_lsn < lsn:
            if self._failure is not None:
                raise JournalCorruptionError(f"journal sync failed: {self._failure}")
            await self.request_sync().wait()

    async def sync(self) -> int:
        """Make everything queued so far durable; returns the durable LSN."""
        self.write_queued()
        await self.wait_durable(self.written_lsn)
        return self.durable_lsn

    def _sync_files(self, job: _SyncJob) -> None:
        """Blocking, in the sync thread: rolled files first, the directory, then the
        current file; only then is anything below ``job.target_lsn`` durable."""
        for fd in job.rolled_fds:
            os.fdatasync(fd)
            os.close(fd)
        if job.directory_dirty:
            fsync_directory(self.directory)
        os.fdatasync(job.current_fd)

    def _take_round(self) -> _SyncJob | None:
        """On the loop: write the queue and describe the sync that makes it durable."""
        self.write_queued(arm_vd_timer=False)
        target = self.written_lsn
        fds, self._unsynced_fds = self._unsynced_fds, []
        directory_dirty, self._directory_dirty = self._directory_dirty, False
        self._first_unsynced_write_s = None
        if target > self.durable_lsn or fds or directory_dirty:
            return _SyncJob(target, fds, self._fd, directory_dirty)
        return None

    def _start_round(self) -> None:
        assert self._syncer is not None and not self._round_in_flight
        self._sync_requested = False
        job = self._take_round()
        if job is None:
            self._finish_round()
            return
        self._round_in_flight = True
        self._syncer.submit(job)

    def _round_synced(self, job: _SyncJob) -> None:
        """On the loop (called from the sync thread via the trio token)."""
        self._round_in_flight = False
        if job.error is not None:
            self._failure = job.error
            log.critical("journal fdatasync failed, refusing further appends: %s", job.error)
        else:
            self.syncs += 1
            self.durable_lsn = job.target_lsn
            self._on_durable(job.target_lsn)
        self._finish_round()
        if self._sync_requested and self._failure is None:
            self._start_round()

    def _finish_round(self) -> None:
        done, self._round_done = self._round_done, trio.Event()
        done.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the sync thread, and start rounds that nobody asked for: the VD bound.

        A round runs when a PD appender or ``sync()`` asks for one (``request_sync``),
        or here when the oldest unsynced VD write reaches ``vd_sync_interval_s``.
        """
        self._syncer = _SyncThread(
            self._sync_files, trio.lowlevel.current_trio_token(), self._round_synced
        )
        try:
            task_status.started()
            while not self._closed:
                deadline_s = float("inf")
                if self._first_unsynced_write_s is not None:
                    deadline_s = self._first_unsynced_write_s + self._vd_sync_interval_s
                with trio.move_on_at(deadline_s):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                first = self._first_unsynced_write_s
                vd_due = first is not None and monotonic_s() >= first + self._vd_sync_interval_s
                if (self._sync_requested or vd_due) and not self._round_in_flight:
                    self._start_round()
        finally:
            with trio.CancelScope(shield=True):
                while self._round_in_flight:
                    await self._round_done.wait()
            self._syncer.stop()
            self._syncer = None

    async def close(self) -> None:
        """Sync everything and close the files; the journal accepts nothing after.

        Call after ``run`` has ended (its sync thread is gone); the last round runs in a
        worker thread.
        """
        if self._closed:
            return
        if self._failure is None:
            job = self._take_round()
            if job is not None:
                await trio.to_thread.run_sync(self._sync_files, job)
                self.durable_lsn = job.target_lsn
                self._on_durable(job.target_lsn)
        self._closed = True
        self._finish_round()
        for fd in [*self._unsynced_fds, self._fd]:
            os.close(fd)
        self._unsynced_fds = []

    # ----------------------------------------------------------------- reading
    def read_at(self, lsn: int, length: int) -> bytes:
        """Blocking pread of written journal bytes (call from a worker thread)."""
        index = self._file_index(lsn)
        if index < 0 or lsn + length > self.written_lsn:
            raise JournalCorruptionError(f"journal has no bytes at LSN {lsn}+{length}")
        start, path = self._files[index]
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), length, lsn - start)
        if len(data) != length:
            raise JournalCorruptionError(f"journal file {path.name} is short at LSN {lsn}")
        return data

    def read_entries(self, entries: Sequence[TailEntryLike]) -> list[bytes]:
        """Blocking: re-read tail entries from their frames, CRC-verified.

        Entries whose frames follow each other in one file are read with one pread, so a
        flush of a long evicted backlog costs one read per journal range, not per append.
        """
        results: list[bytes] = []
        index = 0
        while index < len(entries):
            run_end = index + 1
            while (
                run_end < len(entries)
                and entries[run_end].frame_lsn == entries[run_end - 1].end_lsn
                and self._file_index(entries[run_end].frame_lsn)
                == self._file_index(entries[index].frame_lsn)
            ):
                run_end += 1
            start_lsn = entries[index].frame_lsn
            raw = memoryview(self.read_at(start_lsn, entries[run_end - 1].end_lsn - start_lsn))
            for entry in entries[index:run_end]:
                frame = raw[entry.frame_lsn - start_lsn : entry.end_lsn - start_lsn]
                payload_len, crc, seq = FRAME_HEADER.unpack_from(frame)
                payload = frame[FRAME_HEADER.size :]
                if payload_len != len(payload) or crc32c(payload, crc32c(SEQ.pack(seq))) != crc:
                    raise DataCorruptionError(
                        f"journal frame at LSN {entry.frame_lsn} failed its CRC32C check"
                    )
                results.append(bytes(payload[append_header_size(payload[0]) + entry.frame_skip :]))
            index = run_end
        return results

    def _file_index(self, lsn: int) -> int:
        return bisect.bisect_right(self._files, lsn, key=lambda f: f[0]) - 1

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
