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
- A chunk that cannot be read (missing, unreadable, short) raises ``ChunkUnavailable``;
  callers fall back to the daemon, which knows where the bytes are now.
- Remote blocks are cached verified, in an LRU bounded in bytes; local blocks are not
  (the page cache already holds them).
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

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.blocks.filesystems import open_filesystem
from tierfs.blocks.verify import BlockAddress, verified_block
from tierfs.contracts.arguments import check_read_window
from tierfs.contracts.errors import ChunkUnavailable, OffsetOutOfRangeError
from tierfs.contracts.info import SegmentInfo
from tierfs.remote.client import TierClient

DEFAULT_REMOTE_CACHE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class ChunkRef:
    """One chunk as the layout describes it: where it is and which segment bytes it holds."""

    url: str
    start: int  # segment offset of the chunk's first byte
    end: int  # segment offset after its last committed byte
    block_crc32c: tuple[int, ...]

    @classmethod
    def from_layout(cls, entry: dict[str, Any]) -> ChunkRef:
        return cls(entry["url"], int(entry["start"]), int(entry["end"]),
                   tuple(int(x) for x in entry["block_crc32c"]))


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

    def can_read(self, url: str) -> bool:
        """Local chunks always; others only when storage options for them were given
        (their endpoint and credentials are the daemon's, not known here)."""
        return url.startswith("file://") or self._storage_options is not None

    def read(self, layout: SegmentLayout, start: int, end: int) -> bytes:
        """Segment bytes ``[start, end)``, all below ``layout.flushed_end``."""
        if end > layout.flushed_end:
            raise ValueError(f"range end {end} is beyond the chunks (they end at {layout.flushed_end})")
        pieces = [self._read_chunk(chunk, max(start, chunk.start), min(end, chunk.end))
                  for chunk in layout.chunks_for(start, end)]
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    # ----------------------------------------------------------------- one chunk
    def _read_chunk(self, chunk: ChunkRef, start: int, end: int) -> bytes:
        """Segment bytes ``[start, end)`` of one chunk, by verified whole blocks."""
        if not self.can_read(chunk.url):
            raise ChunkUnavailable(f"no storage options to read {chunk.url} directly")
        first = (start - chunk.start) // BLOCK_BYTES
        last = (end - 1 - chunk.start) // BLOCK_BYTES
        length = chunk.end - chunk.start
        spans = [(i * BLOCK_BYTES, min(length, (i + 1) * BLOCK_BYTES)) for i in range(first, last + 1)]
        if chunk.url.startswith("file://"):
            blocks = self._read_local(chunk.url[len("file://"):], spans)
        else:
            blocks = self._read_remote(chunk.url, spans, chunk.block_crc32c[first : last + 1])
        views = []
        for index, (block, (block_start, _)) in enumerate(zip(blocks, spans, strict=True)):
            address = BlockAddress(f"chunk {chunk.url}", first + index, chunk.start + block_start)
            verified_block(block, len(block), chunk.block_crc32c[first + index], address)
            lo = max(0, start - chunk.start - block_start)
            hi = min(len(block), end - chunk.start - block_start)
            views.append(memoryview(block)[lo:hi])
        if len(views) == 1 and len(views[0]) == len(blocks[0]):
            return blocks[0]
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

    def _read_remote(self, url: str, spans: Sequence[tuple[int, int]], crcs: Sequence[int]) -> list[bytes]:
        keys = [(url, block_start, crc) for (block_start, _), crc in zip(spans, crcs, strict=True)]
        with self._lock:
            cached = [self._cache.get(key) for key in keys]
        missing = [i for i, block in enumerate(cached) if block is None]
        if missing:
            try:
                fs, path = open_filesystem(url, self._storage_options)
                fetched = fs.cat_ranges([path] * len(missing), [spans[i][0] for i in missing],
                                        [spans[i][1] for i in missing], on_error="return")
            except Exception as e:  # any fsspec backend's error: the daemon can still serve
                raise ChunkUnavailable(f"cannot read chunk {url}: {e}") from None
            for i, block in zip(missing, fetched, strict=True):
                if isinstance(block, BaseException) or len(block) != spans[i][1] - spans[i][0]:
                    raise ChunkUnavailable(f"cannot read chunk {url}: {block!r:.200}")
                if crc32c(block) == crcs[i]:  # only verified blocks are cached
                    with self._lock:
                        self._cache[keys[i]] = block
                cached[i] = block
            with self._lock:
                self.bytes_read += sum(spans[i][1] - spans[i][0] for i in missing)
        return [block for block in cached if block is not None]


def read_directly(direct: DirectChunkReader, client: TierClient, name: str, offset: int, length: int | None,
                  unconfirmed: bool) -> bytes:
    """Blocking: segment bytes as the daemon's ``read`` gives them (same limits and
    errors), the flushed part read from the chunks here, the rest through the daemon."""
    check_read_window(offset, length)
    info = client.stat(name)
    if not isinstance(info, SegmentInfo):  # the daemon gives the directory's error
        return client.read(name, offset, None if length is None else offset + length, unconfirmed)
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
