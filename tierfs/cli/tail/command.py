"""``tierfs tail``: GNU tail over segments (options: ``tail_options``; bytes:
``tail_source``, from the daemon or the store in-process).

What it prints, as GNU tail does: the last ``-n`` lines (10) or ``-c`` bytes of each
PATH, or from line/byte ``+N`` on, with ``==> PATH <==`` headers when there are several
(``-q`` none, ``-v`` always) and again whenever the output switches to another PATH
while following. Messages go to stderr in GNU's words (``tail: cannot open 'x' for
reading: No such file or directory``, ``tail: 'x' has been replaced;  following new
file``, ...). Lines are counted from the first byte retention kept; ``-c +N`` is byte
N of the segment (the offset an append returned, plus one).

Following (``-f``, ``-F``):
- ``-f`` follows the segment each PATH named when tail opened it. A rename within its
  directory (log rotation) is followed: when its stream ends, tail looks the segment
  id up in that directory (one listing). A segment deleted, or moved to another
  directory, is no longer followed (``tail: x: No such file or directory``).
- ``-F`` follows the name. When the name no longer holds the segment (deleted, renamed
  away, replaced by a rename or a re-create), tail first prints what the old segment
  got before it moved (if it is still in the directory), then says what happened and
  follows whatever segment holds the name from its start. A name that holds nothing is
  looked up once every ``NAME_RETRY_S`` until it does (a create is a namespace event,
  which no growth notification carries).
- Growth itself is never polled for: each follow sleeps until the daemon (or the
  store) says bytes became durable. The daemon ends a stream within about a second
  of its segment being deleted or renamed, which is how a name change is learned.
- ``--pid PID``: once the process has ended (``pidfd_open``: woken when it exits;
  where that is missing, checked every ``PID_CHECK_S``), the bytes that became
  durable before are printed and tail ends, exit 0.

Exit code: 1 when a PATH could not be opened or no followed PATH remains, else 0.

Invariants: each byte of a followed segment is printed once, in order, and only bytes
of the segment being followed (reads are pinned to its id); memory is bounded
(``PRINT_PIECE_BYTES``, ``SCAN_BYTES``) whatever the segments' sizes.
"""

from __future__ import annotations

import argparse
import errno
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

import trio

from tierfs.cli.tail.options import FOLLOW_DESCRIPTOR, FOLLOW_NAME, TailOptions
from tierfs.cli.tail.source import TailSource, source_for
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import InvalidNameError, NameTooLongError
from tierfs.contracts.reports.info import DirectoryInfo, Info, SegmentInfo

EXIT_OK, EXIT_FAILED = 0, 1
PRINT_PIECE_BYTES = 4 << 20  # bytes are printed in pieces of at most this size
SCAN_BYTES = 256 << 10  # -n N / -n +N look for newlines in pieces of this size
NAME_RETRY_S = 1.0  # a name -F waits for is looked up this often (GNU tail's -s default)
PID_CHECK_S = 1.0  # without pidfd_open, --pid's process is checked this often
# what makes a name unopenable (a per-PATH message); other errors end tail
NAME_ERRORS = (FileNotFoundError, NotADirectoryError, InvalidNameError)


def _quoted(name: str) -> str:
    """A name in a message, quoted as GNU tail quotes it."""
    return "'" + name.replace("'", "'\\''") + "'"


def _reason(error: Exception) -> str:
    if isinstance(error, FileNotFoundError):
        return os.strerror(errno.ENOENT)
    if isinstance(error, NotADirectoryError):
        return os.strerror(errno.ENOTDIR)
    return os.strerror(errno.ENAMETOOLONG if isinstance(error, NameTooLongError) else errno.EINVAL)


def _message(text: str) -> None:
    print(f"tail: {text}", file=sys.stderr, flush=True)


class FollowedFile:
    """One PATH: where its segment is, and how far it has been printed."""

    def __init__(self, path: str) -> None:
        self.path = path  # as given: headers, messages, and the name -F follows
        self.name = path  # where its segment is now (-f follows renames)
        self.segment_id: int | None = None  # None: nothing opened (yet)
        self.offset = 0  # the end of what was printed
        self.following = False
        self.announce = False  # say "has appeared" once a segment holds the name

    def open(self, info: SegmentInfo, offset: int) -> None:
        self.name, self.segment_id, self.offset = info.name, info.segment_id, offset


class TailOutput:
    """stdout, shared by the follows (threads through a daemon): a header before the
    bytes of a PATH other than the last one printed, each piece flushed."""

    def __init__(self, out: BinaryIO, headers: bool) -> None:
        self._out = out
        self._headers = headers
        self._lock = threading.Lock()
        self._last: FollowedFile | None = None
        self._first = True
        self.closed = False  # no more follow output (--pid's end, or stdout went away)
        self.broken = False  # stdout went away

    def _header(self, file: FollowedFile) -> None:
        if self._headers:
            separator = b"" if self._first else b"\n"  # a blank line between parts, as GNU tail
            self._out.write(separator + f"==> {file.path} <==\n".encode())
            self._first = False
        self._last = file

    def _guarded(self, write: Callable[[], None]) -> bool:
        try:
            write()
            self._out.flush()
        except BrokenPipeError:  # the reader went away (tierfs tail | head): stop quietly
            self.closed = self.broken = True
            try:  # nothing left buffered may fail again at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._out.fileno())
            except (OSError, ValueError):
                pass
            return False
        return True

    def begin(self, file: FollowedFile) -> bool:
        """The header of ``file``'s first part (printed even if the part is empty)."""
        with self._lock:
            return not self.broken and self._guarded(functools.partial(self._header, file))

    def _write(self, file: FollowedFile, data: bytes) -> None:
        if self._last is not file:
            self._header(file)
        self._out.write(data)

    def deliver(self, file: FollowedFile, data: bytes, *, after_close: bool = False) -> bool:
        """Print ``data``, the next bytes of ``file``; False once output is closed
        (``after_close``: the last bytes once --pid's process ended, printed anyway)."""
        with self._lock:
            if self.broken or (self.closed and not after_close):
                return False
            if not self._guarded(functools.partial(self._write, file, data)):
                return False
            file.offset += len(data)
            return True

    def close(self) -> None:
        with self._lock:
            self.closed = True


class Tail:
    def __init__(self, options: TailOptions, source: TailSource, output: TailOutput) -> None:
        self.options = options
        self.source = source
        self.output = output
        self.files = [FollowedFile(path) for path in options.paths]
        self.failed = False

    # ------------------------------------------------------------ what is printed first
    async def _read(self, file: FollowedFile, offset: int, length: int) -> bytes:
        assert file.segment_id is not None
        return await self.source.read(file.name, file.segment_id, offset, length)

    async def _last_lines_start(self, file: FollowedFile, info: SegmentInfo, lines: int) -> int:
        """Offset of the first of the last ``lines`` lines (a final newline ends a line)."""
        if lines == 0:
            return info.length
        position, seen = info.length, 0
        while position > info.start_offset:
            start = max(info.start_offset, position - SCAN_BYTES)
            piece = await self._read(file, start, position - start)
            index = len(piece)
            while (index := piece.rfind(b"\n", 0, index)) >= 0:
                if start + index != info.length - 1:
                    seen += 1
                    if seen == lines:
                        return start + index + 1
            position = start
        return info.start_offset

    async def _line_start(self, file: FollowedFile, info: SegmentInfo, line: int) -> int:
        """Offset of line ``line`` (1 is the first), or the end if there are fewer."""
        position, to_skip = info.start_offset, max(0, line - 1)
        while to_skip and position < info.length:
            piece = await self._read(file, position, min(SCAN_BYTES, info.length - position))
            index = -1
            while to_skip and (index := piece.find(b"\n", index + 1)) >= 0:
                to_skip -= 1
            if not to_skip:
                return position + index + 1
            position += len(piece)
        return position

    async def _first_offset(self, file: FollowedFile, info: SegmentInfo) -> int:
        count = self.options.bytes
        if count is not None:
            if count.from_start:
                return min(info.length, max(info.start_offset, count.value - 1))
            return max(info.start_offset, info.length - count.value)
        count = self.options.lines
        assert count is not None
        if count.from_start:
            return await self._line_start(file, info, count.value)
        return await self._last_lines_start(file, info, count.value)

    async def _print_to(self, file: FollowedFile, end: int) -> bool:
        """Print ``file``'s segment up to ``end``; False if it went away or output closed."""
        while file.offset < end:
            try:
                data = await self._read(file, file.offset, min(end - file.offset, PRINT_PIECE_BYTES))
            except NAME_ERRORS:
                return False
            if not data or not self.output.deliver(file, data, after_close=True):
                return False
        return True

    async def _start(self, file: FollowedFile) -> None:
        """Print the first part of ``file`` and decide whether it is followed."""
        follow, retry = self.options.follow, self.options.retry
        try:
            info = await self.source.stat(file.path)
        except NAME_ERRORS as e:
            _message(f"cannot open {_quoted(file.path)} for reading: {_reason(e)}")
            self.failed = True
            file.following = file.announce = follow is not None and retry
            return
        if isinstance(info, DirectoryInfo):
            _message(f"error reading {_quoted(file.path)}: Is a directory")
            self.failed = True
            keep_trying = follow == FOLLOW_NAME and retry
            if follow is not None:
                _message(f"{file.path}: cannot follow end of this type of file"
                         + ("" if keep_trying else "; giving up on this name"))
            file.following = file.announce = keep_trying
            return
        if not self.output.begin(file):
            return
        file.open(info, info.start_offset)
        file.offset = await self._first_offset(file, info)
        await self._print_to(file, info.length)
        file.following = follow is not None

    # ------------------------------------------------------------ following
    async def _stat_or_none(self, name: str) -> Info | None:
        try:
            return await self.source.stat(name)
        except NAME_ERRORS:
            return None

    async def _where_is(self, file: FollowedFile) -> str | None:
        """The name ``file``'s segment has now: the one it had, another in the same
        directory (renamed there), or None (deleted, or moved elsewhere)."""
        now = await self._stat_or_none(file.name)
        if isinstance(now, SegmentInfo) and now.segment_id == file.segment_id:
            return file.name
        try:
            entries = await self.source.list(file.name.rpartition("/")[0])
        except NAME_ERRORS:
            return None
        return next((entry.name for entry in entries
                     if isinstance(entry, SegmentInfo) and entry.segment_id == file.segment_id), None)

    async def _wait_for_name(self, file: FollowedFile) -> None:
        """-F: until a segment holds ``file.path``; then follow it from its start."""
        while True:
            now = await self._stat_or_none(file.path)
            if isinstance(now, SegmentInfo):
                if file.announce:
                    _message(f"{_quoted(file.path)} has appeared;  following new file")
                file.open(now, now.start_offset)
                file.announce = False
                return
            await trio.sleep(NAME_RETRY_S)

    async def _after_stream_end(self, file: FollowedFile) -> bool:
        """The name no longer holds the followed segment: whether to go on, and where."""
        where = await self._where_is(file)
        if where == file.name:  # still there: the stream merely ended
            return True
        if self.options.follow == FOLLOW_DESCRIPTOR:
            if where is not None:
                file.name = where
                return True
            _message(f"{file.path}: {os.strerror(errno.ENOENT)}")
            return False
        if where is not None:  # rotated away: what it got before it moved, then the name
            old_name, file.name = file.name, where
            now = await self._stat_or_none(where)
            if isinstance(now, SegmentInfo) and now.segment_id == file.segment_id:
                await self._print_to(file, now.length)
            file.name = old_name
        now = await self._stat_or_none(file.path)
        if isinstance(now, SegmentInfo):
            _message(f"{_quoted(file.path)} has been replaced;  following new file")
            file.open(now, now.start_offset)
            return True
        if isinstance(now, DirectoryInfo):
            _message(f"{_quoted(file.path)} has been replaced with an untailable file; giving up on this name")
            return False
        if not self.options.retry:
            _message(f"{file.path}: {os.strerror(errno.ENOENT)}")
            return False
        _message(f"{_quoted(file.path)} has become inaccessible: {os.strerror(errno.ENOENT)}")
        file.segment_id, file.announce = None, True
        return True

    async def _follow(self, file: FollowedFile, everything: trio.CancelScope) -> None:
        while not self.output.closed:
            if file.segment_id is None:
                await self._wait_for_name(file)
            assert file.segment_id is not None
            await self.source.follow(file.name, file.segment_id, file.offset,
                                     functools.partial(self.output.deliver, file))
            if self.output.broken:
                everything.cancel()
            if self.output.closed or not await self._after_stream_end(file):
                return

    async def _final_bytes(self, followed: list[FollowedFile]) -> None:
        """--pid's process ended: what became durable before it did."""
        for file in followed:
            if file.segment_id is not None and await self._where_is(file) == file.name:
                now = await self._stat_or_none(file.name)
                if isinstance(now, SegmentInfo):
                    await self._print_to(file, now.length)

    async def run(self) -> int:
        options = self.options
        if options.pid is not None and options.follow is None:
            _message("warning: PID ignored; --pid=PID is useful only when following")
        for file in self.files:
            await self._start(file)
            if self.output.broken:
                return EXIT_OK
        if options.follow is None:
            return EXIT_FAILED if self.failed else EXIT_OK
        followed = [file for file in self.files if file.following]
        pid_ended = False
        async with trio.open_nursery() as nursery:
            if options.pid is not None and followed:
                async def stop_when_the_process_ends(pid: int) -> None:
                    nonlocal pid_ended
                    await wait_for_process_end(pid)
                    pid_ended = True
                    self.output.close()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stop_when_the_process_ends, options.pid)
            async with trio.open_nursery() as follows:
                for file in followed:
                    follows.start_soon(self._follow, file, nursery.cancel_scope)
            nursery.cancel_scope.cancel()  # every follow ended
        if pid_ended:
            await self._final_bytes(followed)
        elif not self.output.broken:
            _message("no files remaining")
            return EXIT_FAILED
        return EXIT_FAILED if self.failed else EXIT_OK


def _process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


async def wait_for_process_end(pid: int) -> None:
    """Return once process ``pid`` has ended (at once if there is none)."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (an old kernel, a sandbox): look each second
        while _process_running(pid):
            await trio.sleep(PID_CHECK_S)
        return
    try:
        await trio.lowlevel.wait_readable(descriptor)  # readable once the process has exited
    finally:
        os.close(descriptor)


async def tail_command(args: argparse.Namespace, store: SegmentStoreAPI) -> int:
    """``tierfs tail [-f|-F] [-n [+]N|-c [+]N] [-q|-v] [--pid PID] PATH...``."""
    options = TailOptions.of(args)
    count = options.lines or options.bytes
    if count is not None and count.value == 0 and not count.from_start and not options.follow:
        return 0  # as GNU tail: nothing to print, not even headers (nor errors)
    source = source_for(store, len(options.paths))
    output = TailOutput(sys.stdout.buffer, options.headers)
    return await Tail(options, source, output).run()
