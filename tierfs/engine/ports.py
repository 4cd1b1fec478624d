"""The narrow ports the engine's parts declare (after Pravega's ``WriterDataSource``):
each part names the few things it needs from elsewhere, and the store façade hands it
objects that have them. No part ever receives the façade.

- ``ChunkSource``: a segment's chunk records (the reader, the storage writer, the
  offloader, fsck). Implemented by ``ChunkCatalogue``.
- ``LongTermBlocks``: one verified block of an offloaded chunk, or the block CRCs and
  a streamed read of a run of adjacent blocks (the block source).
  Implemented by ``tierfs.offload.reads.LongTermReads``.
- ``JournalFiles``: what the storage writer needs of the journal: a sync before a
  requested flush, and deleting fully flushed files. Implemented by ``Journal``.
- ``GarbageSink``: queue tier-2 objects for deletion once their metadata is gone.
  Implemented by ``GarbageCollector``.
- ``CreationLog``: what a create needs of the journal: a creation frame written (in the
  page cache at once, on disk with the next sync) and a wait for that sync.
  Implemented by ``Journal``.
- ``AppendLog``: what the appender needs of the journal: an append frame queued (its
  LSNs assigned at once) and the waits for write(2) and for fdatasync.
  Implemented by ``Journal``.
- ``FlushBacklog``: what the appender needs of the storage writer: room in the backlog,
  counting new bytes in it, a wake-up when a segment has enough to flush, and (for the
  ``tier2`` durability level) a wait until tier-2 holds a segment's bytes.
  Implemented by ``StorageWriter``.
- ``AckGate``: whether this store may acknowledge right now (``check`` raises unless it
  may), and the lease whose lapse holds durable lengths back. Implemented by ``Tenure``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from tierfs.engine.ownership.tenure import Lease
from tierfs.engine.record_types import Chunk
from tierfs.engine.segments.state import SegmentState


class ChunkSource(Protocol):
    async def chunks_of(self, seg: SegmentState) -> list[Chunk]: ...

    def chunks_covering(self, seg: SegmentState, start: int, end: int) -> list[Chunk]:
        """The chunk records overlapping ``[start, end)``, by offset: from the loaded list,
        or, where nothing loaded it, from the metadata (an index range): the cost of a
        read follows the read, not the number of chunks."""
        ...


class LongTermBlocks(Protocol):
    async def read_block(self, chunk: Chunk, block: int) -> bytes: ...

    async def block_crc32c(self, chunk: Chunk) -> Sequence[int]: ...

    def read_blocks(self, chunk: Chunk, spans: Sequence[tuple[int, int]],
                    on_block: Callable[[int, bytes], None]) -> None: ...


class JournalFiles(Protocol):
    async def sync(self) -> int: ...

    @property
    def written_lsn(self) -> int: ...

    def file_count(self) -> int: ...

    def deletable_files(self, checkpoint_lsn: int) -> list[Path]: ...

    def forget_files(self, paths: list[Path]) -> None: ...

    def roll_for_reclaim(self, checkpoint_lsn: int) -> bool: ...


class GarbageSink(Protocol):
    async def queue(self, names: list[str]) -> None: ...

    def collect_soon(self) -> None: ...


class CreationLog(Protocol):
    def make_room(self, frame_bytes: int) -> None: ...

    def add_create(self, segment_id: int, name: str, record: bytes) -> int: ...

    def write_queued(self, *, arm_vd_timer: bool = True) -> bool: ...

    async def wait_written(self, lsn: int) -> None: ...

    async def wait_durable(self, lsn: int) -> None: ...


class AppendLog(Protocol):
    written_lsn: int

    def add_append(self, segment_id: int, offset: int, data: bytes, wall_ns: int = 0,
                   writer: int = 0, writer_seq: int = 0) -> tuple[int, int]: ...

    async def wait_written(self, lsn: int) -> None: ...

    async def wait_durable(self, lsn: int) -> None: ...


class FlushBacklog(Protocol):
    def check_backlog(self, size: int) -> None: ...

    def appended(self, seg: SegmentState, size: int) -> None: ...

    def wake(self) -> None: ...

    async def wait_flushed(self, seg: SegmentState, end: int) -> None: ...


class AckGate(Protocol):
    @property
    def lease(self) -> Lease | None: ...

    def check(self, name: str) -> None: ...
