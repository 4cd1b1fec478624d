"""The journal's sync rounds through Linux native AIO: the event loop submits an
fdatasync (``io_submit`` of ``IOCB_CMD_FDSYNC``), the kernel runs it in its own worker
and signals an eventfd when it is done.

Why: with a Python sync thread, a round can start only once that thread gets the GIL,
which the busy event loop holds while it runs the appenders the previous round woke;
here no Python thread is involved, the loop sees a completion with one non-blocking
read (``poll``, called between appenders) and starts the next round at once with what
was written meanwhile. Where AIO is missing (another architecture, a kernel or a
sandbox without it) ``AioFdatasync.open`` returns None and the journal uses its sync
thread (``journal.sync_thread.SyncThread``) instead.

Invariants:
- ``AioRounds`` offers what ``SyncThread`` offers (request, take_report, in flight,
  probably_done, stop), on the same bookkeeping (``journal.rounds.RoundBook``): one
  round in flight at a time, rounds in order, a round's target durable only once its
  fdatasync completed without error.
- A round that must also sync and close rolled files or fsync the directory runs the
  journal's blocking sync in a worker thread instead (once per file roll).
- A file descriptor with an fdatasync in flight is never closed: ``stop`` waits for it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import threading
from collections.abc import Callable

import trio

from tierfs.engine.journal.rounds import BookedRounds, RoundBook, SyncJob, SyncReport

log = logging.getLogger(__name__)

# (io_setup, io_destroy, io_getevents, io_submit) system call numbers; glibc has no
# wrappers for them. Other architectures use the sync thread.
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1  # signal aio_resfd (an eventfd) on completion


class _Iocb(ctypes.Structure):  # struct iocb, little endian (linux/aio_abi.h)
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):  # struct io_event
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class AioFdatasync:
    """One AIO context for one fdatasync at a time, completions signalled on an eventfd."""

    def __init__(self, syscall: Callable[..., int], numbers: tuple[int, int, int, int]) -> None:
        self._syscall = syscall
        _, destroy, getevents, submit = numbers
        self._io_destroy = ctypes.c_long(destroy)
        self._io_getevents = ctypes.c_long(getevents)
        self._io_submit = ctypes.c_long(submit)
        self._context = ctypes.c_ulong(0)
        # Every integer argument goes as a C long: syscall(2) reads its arguments as longs.
        self._one = ctypes.c_long(1)
        if syscall(ctypes.c_long(numbers[0]), ctypes.c_long(4), ctypes.byref(self._context)) != 0:
            raise OSError(ctypes.get_errno(), "io_setup failed")
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._iocb = _Iocb(aio_lio_opcode=_IOCB_CMD_FDSYNC, aio_flags=_IOCB_FLAG_RESFD,
                           aio_resfd=self.eventfd)
        self._iocbs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb))
        self._events = (_IoEvent * 1)()
        self._zero_timeout = _Timespec(0, 0)  # io_getevents: take what is there, never wait

    @classmethod
    def open(cls) -> AioFdatasync | None:
        """An AIO context, or None where this kernel, architecture or sandbox has none
        (the caller then syncs in a thread)."""
        numbers = _SYSCALLS.get(platform.machine())
        if numbers is None or os.environ.get("TIERFS_JOURNAL_AIO", "1") == "0":
            return None
        try:
            syscall = ctypes.CDLL(None, use_errno=True).syscall
            syscall.restype = ctypes.c_long
            return cls(syscall, numbers)
        except (OSError, AttributeError) as e:
            log.info("journal: no native AIO (%s), fdatasync runs in a thread", e)
            return None

    @classmethod
    async def open_probed(cls, fd: int) -> AioFdatasync | None:
        """``open``, kept only if an fdatasync of ``fd`` through it works."""
        aio = cls.open()
        if aio is None:
            return None
        usable = False
        try:
            usable = await aio.probe(fd)
        except OSError as e:
            log.info("journal: native AIO failed its first fdatasync (%s), a thread will", e)
        finally:
            if not usable:
                aio.close()
        return aio if usable else None

    async def probe(self, fd: int) -> bool:
        """Whether this kernel runs an fdatasync of ``fd`` through AIO (before 4.18 it
        refuses with EINVAL): one real fdatasync, awaited."""
        try:
            self._submit(fd)
        except OSError as e:
            log.info("journal: native AIO cannot fdatasync here (%s), a thread will", e)
            return False
        while True:
            await trio.lowlevel.wait_readable(self.eventfd)
            result = self._completed()
            if result is not None:
                return result == 0

    def submit(self, fd: int) -> None:
        """Start an fdatasync of ``fd`` (one at a time); ``completed`` tells its end."""
        self._submit(fd)

    def _submit(self, fd: int) -> None:
        self._iocb.aio_fildes = fd
        if self._syscall(self._io_submit, self._context, self._one, self._iocbs) != 1:
            code = ctypes.get_errno()
            raise OSError(code, f"io_submit of fdatasync failed: {os.strerror(code)}")

    def completed(self) -> int | None:
        """None while the fdatasync runs; else its result (0, or a negative errno)."""
        return self._completed()

    def _completed(self) -> int | None:
        try:
            os.read(self.eventfd, 8)
        except BlockingIOError:
            return None
        while True:
            got = self._syscall(
                self._io_getevents, self._context, self._one, self._one, self._events,
                ctypes.byref(self._zero_timeout),
            )
            if got == 1:
                return int(self._events[0].res)
            if got < 0 and ctypes.get_errno() == errno.EINTR:
                continue
            raise OSError(ctypes.get_errno() or errno.EIO, "io_getevents found no completion")

    def close(self) -> None:
        """After the last completion (io_destroy would wait for one in flight)."""
        self._syscall(self._io_destroy, self._context)
        os.close(self.eventfd)


class AioRounds(BookedRounds):
    """Sync rounds driven from the event loop through ``AioFdatasync`` (see module).

    ``splits_woken`` is False: the appenders a round woke form one round. Split in two
    (as the sync thread's are), the second half's round waits for the first's
    fdatasync anyway, each round costs the loop its completion, wake-ups and
    bookkeeping twice as often, and the kernel's AIO worker takes the CPU the loop
    needs: 32 PD writers reached 0.224 of the append benchmark's raw (b) split against
    0.259 not (medians of five alternating pairs; 14 against 19 us of loop CPU per
    append).
    """

    splits_woken = False  # a property of the backend, see above

    def __init__(
        self,
        aio: AioFdatasync,
        *,
        lock: threading.Lock,
        take_job: Callable[[], SyncJob],
        run_job: Callable[[SyncJob], None],
        on_report: Callable[[], None],
        synced_lsn: int,
    ) -> None:
        self._aio = aio
        self._lock = lock
        self._take_job = take_job
        self._run_job = run_job
        self._on_report = on_report
        self._book = RoundBook(synced_lsn)
        self._job: SyncJob | None = None
        self._round_done = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch for completions between scheduler batches (``poll`` catches them
        sooner while appenders run); stopping waits for the round in flight."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(self._aio.eventfd)
                    self.poll()
        finally:
            with trio.CancelScope(shield=True):
                self._book.stopped = True
                while self.in_flight:
                    if self._job is None:  # a thread round: it reports by itself
                        await self._round_done.wait()
                    else:
                        await trio.lowlevel.wait_readable(self._aio.eventfd)
                        self.poll()
            self._aio.close()

    # ------------------------------------------------------ the SyncThread face
    def request(self, lsn: int, *, force: bool = False, hand_over: bool = False) -> bool:
        """Ask for everything written up to ``lsn`` to become durable; a round starts at
        once if none is in flight. Never blocks (``hand_over`` has nothing to do)."""
        book = self._book
        if book.ask(lsn, force=force) and not book.in_flight and not book.stopped:
            self._start()
        return False

    def take_report(self) -> SyncReport:
        return self._book.report()

    def next_round_due(self, queued_bytes: int) -> bool:
        """Should the loop write its queue and start a round now (mid-batch)? Yes when
        the round in flight has just completed (polled here once it has run a typical
        fdatasync) and nothing else was asked for: the disk would sit idle otherwise."""
        if not self.in_flight or not self.probably_done():
            return False
        self.poll()
        return not self.in_flight

    def poll(self) -> None:
        """Take in the round in flight if the kernel has completed it (one non-blocking
        read), then start the next at once if more was asked for."""
        if self._job is None:
            return
        try:
            result = self._aio.completed()
        except OSError as e:  # the completion cannot be read: nothing is known durable
            self._job = None
            self._finish(e)
            return
        if result is not None:
            error = OSError(-result, os.strerror(-result)) if result < 0 else None
            self._job = None
            self._finish(error)

    # ---------------------------------------------------------------- rounds
    def _start(self) -> None:
        with self._lock:
            job = self._take_job()
        self._book.started(job)
        if job.rolled_fds or job.directory_dirty:
            assert self._nursery is not None
            self._nursery.start_soon(self._thread_round, job)
            return
        try:
            self._aio.submit(job.current_fd)
        except OSError as e:
            self._finish(e)
            return
        self._job = job

    async def _thread_round(self, job: SyncJob) -> None:
        # Shielded: the job holds the only references to its rolled files, so it runs to
        # completion even when the journal is stopping.
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(self._run_job, job)
            except OSError as e:
                self._finish(e)
            else:
                self._finish(None)

    def _finish(self, error: OSError | None) -> None:
        book = self._book
        book.finished(book.covered_lsn, error)  # timed until the loop noticed: at most
        if book.wanted():
            self._start()  # the disk first, then the loop's bookkeeping
        self._round_done.set()
        self._round_done = trio.Event()
        self._on_report()
