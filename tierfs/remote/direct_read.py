"""Direct chunk reads: flushed segment bytes straight from chunk objects, not via the daemon.

A client (the fsspec plugin, a Spark executor) asks the daemon once for a segment's chunk
layout (``GET /v1/layout/{path}``: chunk URL, segment byte range, per-1 MiB-block
CRC32Cs) and then reads the chunks itself: ``pread`` for ``file://`` chunks, ranged
reads through fsspec for any other URL.

Invariants:
- Every byte returned was verified: whole 1 MiB blocks (aligned to the chunk start, as
  in ``checksums``) are read and checked against the layout's block CRC32C before any
  byte of them is returned; a mismatch raises ``DataCorruptionError`` and returns
  nothing.
- Only bytes inside a chunk's committed range ``[start, end)`` are read, so an object
  that holds more (an uncommitted flush after a crash) never leaks those bytes.
- A read is served only from chunks that cover its range exactly, each starting where
  the one before ends: a layout with a gap or an overlap there (which no committed
  state has) is ``ChunkUnavailable``, so the daemon, whose reader checks the bytes
  it assembles, answers instead; never fewer or repeated bytes.
- A chunk that cannot be read (missing, unreadable, short) raises ``ChunkUnavailable``;
  callers fall back to the daemon, which knows where the bytes are now.
- Remote blocks are cached verified, in an LRU bounded in bytes; local blocks are not
  (the page cache already holds them).
- Remote blocks a read needs that are not cached are fetched as runs: adjacent blocks
  of one chunk, up to ``RUN_BLOCKS``, with one streamed ranged GET each
  (``blocks.block_stream``: every block verified the moment it arrives, a deadline per
  block and a hedged twin), ``RUNS_IN_FLIGHT`` at a time; a read that is not done
  after ``READ_ATTEMPTS`` (each resuming after the blocks already brought) is
  ``ChunkUnavailable``.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import os
import threading
from collections.abc import Sequence
from typing import Any

import cachetools

from tierfs.blocks.block_stream import Run, read_runs
from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.deadlines import DEFAULT_READ_DEADLINE_PER_MIB_S, DeadlineSchedule
from tierfs.blocks.filesystems import open_filesystem
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.arguments import check_read_window
from tierfs.contracts.errors import ChunkUnavailable, DataCorruptionError, OffsetOutOfRangeError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.remote.client import TierClient

DEFAULT_REMOTE_CACHE_BYTES = 64 << 20
# One ranged GET per run of up to 16 adjacent blocks: the GET's fixed cost (~1 ms of
# client CPU, ~1.5 ms of s3rver's) is paid once per 16 MiB instead of per MiB (in
# interleaved trials on s3rver, 16-block runs read a segment faster than 8-block ones).
RUN_BLOCKS = 16
# Runs in flight at once: enough to keep a single-stream server and the client busy
# together, few enough that a read's first runs are not starved by its last.
RUNS_IN_FLIGHT = 4
READ_ATTEMPTS = 3  # deadlines of 1, 2 and 4 s per block, then the daemon serves


@dataclasses.dataclass(frozen=True)
class ChunkRef:
    """One chunk as the layout describes it: where it is and which segment bytes it holds."""

    url: str
    start: int  # segment offset of the chunk's first byte
    end: int  # segment offset after its last committed byte
    block_crc32c: tuple[int, ...]
    object_offset: int = 0  # where the chunk's first byte is in the object (a pack of chunks)

    @classmethod
    def from_layout(cls, entry: dict[str, Any]) -> ChunkRef:
        return cls(entry["url"], int(entry["start"]), int(entry["end"]),
                   tuple(int(x) for x in entry["block_crc32c"]), int(entry.get("object_offset", 0)))


@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    """The chunks of one segment (identified by id, not by name), in offset order."""

    segment_id: int | None  # None: no chunk yet
    chunks: tuple[ChunkRef, ...]

    @classmethod
    def from_json(cls, entries: list[dict[str, Any]]) -> SegmentLayout:
        chunks = tuple(ChunkRef.from_layout(e) for e in entries)
        segment_id = int(entries[0]["segment_id"]) if entries else None
        return cls(segment_id, chunks)

    @property
    def flushed_end(self) -> int:
        """Segment offset up to which the chunks hold every byte."""
        return self.chunks[-1].end if self.chunks else 0

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [c.start for c in self.chunks]

    def chunks_for(self, start: int, end: int) -> list[ChunkRef]:
        """The chunks overlapping ``[start, end)`` (which must lie below ``flushed_end``)."""
        first = max(0, bisect.bisect_right(self._starts, start) - 1)
        return [c for c in self.chunks[first:] if c.start < end]

    def covering(self, start: int, end: int) -> list[ChunkRef]:
        """``chunks_for(start, end)``, checked to cover the range without a gap or an
        overlap (each chunk starting where the one before ends); else ``ChunkUnavailable``."""
        chunks = self.chunks_for(start, end)
        position = start
        for chunk in chunks:
            if chunk.start > position or (chunk is not chunks[0] and chunk.start != position):
                raise ChunkUnavailable(
                    f"the chunk layout of segment {self.segment_id} does not cover bytes {start}..{end} "
                    f"contiguously: a chunk starts at {chunk.start}, the bytes before end at {position}"
                )
            position = chunk.end
        if position < end:
            raise ChunkUnavailable(
                f"the chunk layout of segment {self.segment_id} covers bytes {start}..{end} only up to {position}"
            )
        return chunks


class _Block:
    """One block a read needs: its chunk, index, chunk byte span and, once read, bytes."""

    __slots__ = ("chunk", "index", "start", "end", "data")

    def __init__(self, chunk: ChunkRef, index: int) -> None:
        self.chunk = chunk
        self.index = index
        self.start = index * BLOCK_BYTES
        self.end = min(chunk.end - chunk.start, self.start + BLOCK_BYTES)
        self.data: bytes | None = None

    @property
    def address(self) -> BlockAddress:
        return BlockAddress(f"chunk {self.chunk.url}", self.index, self.chunk.start + self.start)

    @property
    def object_span(self) -> tuple[int, int]:
        """The block's bytes in the chunk's object."""
        place = self.chunk.object_offset
        return place + self.start, place + self.end

    @property
    def cache_key(self) -> tuple[str, int, int]:
        return (self.chunk.url, self.object_span[0], self.chunk.block_crc32c[self.index])


class DirectChunkReader:
    """Reads verified byte ranges from chunk objects; safe to share between threads."""

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        remote_cache_bytes: int = DEFAULT_REMOTE_CACHE_BYTES,
    ) -> None:
        self._storage_options = storage_options
        self._cache: cachetools.LRUCache[tuple[str, int, int], bytes] = cachetools.LRUCache(
            maxsize=remote_cache_bytes, getsizeof=len
        )
        self._lock = threading.Lock()
        self.bytes_read = 0  # block bytes read from chunk objects (cache misses)
        self.gets = 0  # ranged reads of remote chunk objects (a run of blocks is one)

    def can_read(self, url: str) -> bool:
        """Local chunks always; others only when storage options for them were given
        (their endpoint and credentials are the daemon's, not known here)."""
        return url.startswith("file://") or self._storage_options is not None

    def read(self, layout: SegmentLayout, start: int, end: int) -> bytes:
        """Segment bytes ``[start, end)``, all below ``layout.flushed_end``."""
        if end > layout.flushed_end:
            raise ValueError(f"range end {end} is beyond the chunks (they end at {layout.flushed_end})")
        blocks: list[_Block] = []
        remote: list[_Block] = []
        for chunk in layout.covering(start, end):
            if not self.can_read(chunk.url):
                raise ChunkUnavailable(f"no storage options to read {chunk.url} directly")
            first = (max(start, chunk.start) - chunk.start) // BLOCK_BYTES
            last = (min(end, chunk.end) - 1 - chunk.start) // BLOCK_BYTES
            wanted = [_Block(chunk, i) for i in range(first, last + 1)]
            blocks.extend(wanted)
            if chunk.url.startswith("file://"):
                local = self._read_local(chunk.url[len("file://"):], [b.object_span for b in wanted])
                for block, data in zip(wanted, local, strict=True):
                    block.data = verified_block(data, len(data), chunk.block_crc32c[block.index], block.address)
            else:
                remote.extend(wanted)
        if remote:
            self._read_remote(remote)
        views = []
        for block in blocks:
            assert block.data is not None
            block_start = block.chunk.start + block.start  # segment offset
            lo, hi = max(0, start - block_start), min(len(block.data), end - block_start)
            views.append(memoryview(block.data)[lo:hi])
        if len(views) == 1 and len(views[0]) == len(blocks[0].data or b""):
            return blocks[0].data or b""
        return b"".join(views)

    def _read_local(self, path: str, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ChunkUnavailable(f"cannot open chunk file {path}: {e.strerror}") from None
        try:
            blocks = []
            for block_start, block_end in spans:
                data = os.pread(fd, block_end - block_start, block_start)
                if len(data) != block_end - block_start:
                    raise ChunkUnavailable(f"chunk file {path} is shorter than its committed length")
                blocks.append(data)
        finally:
            os.close(fd)
        with self._lock:
            self.bytes_read += sum(len(b) for b in blocks)
        return blocks

    def _read_remote(self, blocks: list[_Block]) -> None:
        """Fill ``data`` of remote blocks: from the cache, else adjacent missing blocks of
        a chunk as runs (one streamed ranged GET of up to ``RUN_BYTES``), up to
        ``RUNS_IN_FLIGHT`` at a time, each block verified as it arrives."""
        with self._lock:
            for block in blocks:
                block.data = self._cache.get(block.cache_key)
        runs: dict[str, list[list[_Block]]] = {}  # by chunk URL
        for block in blocks:
            if block.data is not None:
                continue
            chunk_runs = runs.setdefault(block.chunk.url, [])
            previous = chunk_runs[-1] if chunk_runs else None
            if (previous and previous[-1].index + 1 == block.index
                    and previous[-1].chunk is block.chunk and len(previous) < RUN_BLOCKS):
                previous.append(block)
            else:
                chunk_runs.append([block])
        by_filesystem: dict[int, tuple[Any, list[Run]]] = {}
        for url, chunk_runs in runs.items():
            try:
                fs, path = open_filesystem(url, self._storage_options)
            except Exception as e:  # any fsspec backend's error: the daemon can still serve
                raise ChunkUnavailable(f"cannot read chunk {url}: {e}") from None
            entry = by_filesystem.setdefault(id(fs), (fs, []))
            for run in chunk_runs:
                entry[1].append(Run(path, [b.object_span for b in run], functools.partial(self._arrived, run)))
        for fs, fs_runs in by_filesystem.values():
            self._fetch_runs(fs, fs_runs)

    def _fetch_runs(self, fs: Any, runs: list[Run]) -> None:
        deadlines = DeadlineSchedule(BLOCK_BYTES, DEFAULT_READ_DEADLINE_PER_MIB_S)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                read_runs(fs, runs, deadlines.next_s(), RUNS_IN_FLIGHT)
                break
            except (DataCorruptionError, ChunkUnavailable):
                raise  # a block failed its check or is short: asking again changes nothing
            except Exception as e:  # any fsspec backend's error: the daemon can still serve
                if attempt == READ_ATTEMPTS or isinstance(e, (FileNotFoundError, PermissionError)):
                    raise ChunkUnavailable(f"cannot read chunk {runs[0].path}: {e!r:.300}") from None
        with self._lock:
            self.gets += len(runs)

    def _arrived(self, run: list[_Block], index: int, data: bytes) -> None:
        """A block of a run arrived: verify it (only verified blocks are cached)."""
        block = run[index]
        if len(data) != block.end - block.start:
            raise ChunkUnavailable(f"chunk {block.chunk.url} is shorter than its committed length")
        block.data = verified_block(data, len(data), block.chunk.block_crc32c[block.index], block.address)
        with self._lock:
            self._cache[block.cache_key] = block.data
            self.bytes_read += len(data)


def read_directly(direct: DirectChunkReader, client: TierClient, name: str, offset: int, length: int | None,
                  unconfirmed: bool) -> bytes:
    """Blocking: segment bytes as the daemon's ``read`` gives them (same limits and
    errors), the flushed part read from the chunks here, the rest through the daemon."""
    check_read_window(offset, length)
    info = client.stat(name)
    if not isinstance(info, SegmentInfo):  # the daemon's error for it, whatever the window
        return client.read(name, offset, None, unconfirmed)
    limit = info.appended_length if unconfirmed else info.length
    if offset > limit:
        raise OffsetOutOfRangeError(name, offset, limit)
    end = limit if length is None else min(limit, offset + length)
    layout = SegmentLayout.from_json(client.layout(name))
    position, pieces = offset, []
    direct_end = min(end, layout.flushed_end)
    if position < direct_end:
        try:
            pieces.append(direct.read(layout, position, direct_end))
            position = direct_end
        except ChunkUnavailable:  # moved, merged or truncated meanwhile: the daemon knows
            pass
    if position < end:
        pieces.append(client.read(name, position, end, unconfirmed))
    return b"".join(pieces)
