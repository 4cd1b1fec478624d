"""Per-handle sequential detection and adaptive read-ahead.

Design. A FUSE file handle, an fsspec file or a CLI ``cat`` reads a segment through
one ``SegmentReader``. A read that starts where the previous one ended (or at offset 0
for a fresh reader) is sequential: the window starts at one block (1 MiB) and doubles
on every further sequential read up to ``readahead_max_bytes`` (default 32 MiB, capped
at a quarter of the block cache so read-ahead cannot churn the cache it fills). A read
anywhere else is random: the window drops to zero and nothing is prefetched until the
reader is sequential again.

After each sequential read, the blocks of ``[end, end + window)`` that are neither
cached nor in flight are fetched in the background under the store's global tier-2
limiter, so a scan keeps up to ``window`` bytes of GETs in flight ahead of the reader.
Adjacent missing blocks of one chunk are fetched as *runs*: one ranged GET of up to
``run_blocks`` blocks, half the window (``RUNS_PER_WINDOW``) and at most
``MAX_RUN_BYTES``, each block checked and cached as it arrives; the window is topped up
in whole runs (``Reader.prefetch``). So a long scan issues two (or, with a window above
32 MiB, more) GETs of 16 MiB in parallel instead of one GET per MiB, while a random
read still fetches one block.
Read-ahead only covers flushed bytes (the tail is already in memory or the local
journal) and never evicts blocks a read is assembling (pins).

Why doubling from 1 MiB: a reader that stops after its first read costs at most one
extra GET; a long scan reaches full depth after log2(32) = 5 reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.engine.read.reader import Reader
from tierfs.engine.segments.state import SegmentState

# Half the window per GET: two runs in flight (more with a larger window, since a run
# is capped), so the next run arrives while the reader consumes one, and each GET is
# large: on s3rver (one Node thread) two 16 MiB streams did at least as well as four
# 8 MiB ones in interleaved trials.
RUNS_PER_WINDOW = 2
# 16 MiB: a GET's fixed cost (~1 ms of client CPU, ~1.5 ms of s3rver's) is
# small next to 16 MiB of transfer; larger runs only delay their last blocks.
MAX_RUN_BYTES = 16 * BLOCK_BYTES


def run_blocks_for(window_bytes: int) -> int:
    """Blocks per ranged GET of read-ahead for a window (at least one)."""
    return max(1, min(window_bytes // RUNS_PER_WINDOW, MAX_RUN_BYTES) // BLOCK_BYTES)


@dataclasses.dataclass(frozen=True)
class ReaderStatistics:
    reads: int
    sequential_reads: int
    window_bytes: int
    prefetched_blocks: int


class SegmentReader:
    """Reads one segment for one consumer, with read-ahead when it reads sequentially."""

    def __init__(
        self, lookup: Callable[[str], SegmentState], reader: Reader, name: str, max_window_bytes: int
    ) -> None:
        self._lookup = lookup  # the segment is found by name at every read, as a path is
        self._reader = reader
        self.name = name
        self.max_window_bytes = max(0, max_window_bytes)
        self.window_bytes = 0
        self._next_offset: int | None = None
        self._reads = 0
        self._sequential_reads = 0
        self._prefetched = 0

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        seg = self._lookup(self.name)
        data = await self._reader.read_segment(seg, offset, length, unconfirmed=unconfirmed)
        self._reads += 1
        sequential = offset == (self._next_offset if self._next_offset is not None else 0)
        if sequential:
            self._sequential_reads += 1
            self.window_bytes = (
                BLOCK_BYTES if self.window_bytes == 0 else self.window_bytes * 2
            )
            self.window_bytes = min(self.window_bytes, self.max_window_bytes)
        else:
            self.window_bytes = 0
        end = offset + len(data)
        self._next_offset = end
        if self.window_bytes:
            self._prefetched += self._reader.prefetch(
                seg, end, end + self.window_bytes, run_blocks_for(self.window_bytes)
            )
        return data

    def statistics(self) -> ReaderStatistics:
        return ReaderStatistics(
            reads=self._reads,
            sequential_reads=self._sequential_reads,
            window_bytes=self.window_bytes,
            prefetched_blocks=self._prefetched,
        )
