"""fsck: verify every chunk's bytes and the metadata invariants of an open store.

Checks, per segment: chunk records are contiguous from the segment's start offset
(0 unless retention deleted head chunks) up to the flushed length; ``chunk_count``
matches; every chunk object exists (in the chunk store, or in the long-term store once
offloaded, with an index object that matches the record) and is at least as long as
its committed length; every 1 MiB block and the whole chunk match their CRC32C; the
lengths obey flushed <= durable <= appended. Reads use the storage directly, bypassing
the cache, so a cached copy cannot hide damage.
"""

from __future__ import annotations

import dataclasses

import trio

from tierfs.blocks.checksums import BLOCK_BYTES, crc32c
from tierfs.contracts.errors import TierFSError
from tierfs.offload.offloader import require_long_term
from tierfs.offload.reads import LongTermReads
from tierfs.store.facade import SegmentStore


def require_long_term_reads(reads: LongTermReads | None) -> LongTermReads:
    require_long_term(None if reads is None else reads.long_term)
    assert reads is not None
    return reads


@dataclasses.dataclass(frozen=True)
class Problem:
    segment: str
    chunk: str
    message: str

    def __str__(self) -> str:
        where = f"{self.segment}" + (f" chunk {self.chunk}" if self.chunk else "")
        return f"{where}: {self.message}"


@dataclasses.dataclass(frozen=True)
class FsckReport:
    segments: int
    chunks: int
    bytes_checked: int
    problems: list[Problem]


async def fsck(store: SegmentStore) -> FsckReport:
    problems: list[Problem] = []
    chunk_total = checked = 0
    infos = await store.walk_segments()
    for info in infos:
        seg = store.table.segment(info.name)
        if not info.flushed_length <= info.durable_length <= info.appended_length:
            problems.append(Problem(info.name, "", "lengths out of order"))
        chunks = await store.catalogue.chunks_of(seg)
        chunk_total += len(chunks)
        if len(chunks) != info.chunk_count:
            problems.append(
                Problem(info.name, "", f"chunk_count {info.chunk_count} but {len(chunks)} chunk records")
            )
        expected_start = info.start_offset
        for chunk in chunks:
            if chunk.start_offset != expected_start:
                problems.append(
                    Problem(info.name, chunk.name, f"starts at {chunk.start_offset}, expected {expected_start}")
                )
            expected_start = chunk.start_offset + chunk.length
            try:
                storage, key = store.chunk_storage, chunk.name
                if chunk.location:
                    reads = require_long_term_reads(store.long_term_reads)
                    storage, key = reads.long_term.storage, reads.long_term.key_of(chunk.location)
                    await reads.index_of(chunk, cached=False)
                size = await trio.to_thread.run_sync(storage.stat, key, limiter=store.tier2_limiter)
            except TierFSError as e:
                problems.append(Problem(info.name, chunk.name, str(e)))
                continue
            if size < chunk.length:
                problems.append(
                    Problem(info.name, chunk.name, f"object holds {size} bytes, metadata says {chunk.length}")
                )
                continue
            whole = 0
            for block, expected_crc in enumerate(chunk.block_crc32c):
                start = block * BLOCK_BYTES
                end = min(start + BLOCK_BYTES, chunk.length)
                data = await trio.to_thread.run_sync(
                    storage.read, key, start, end, limiter=store.tier2_limiter
                )
                checked += len(data)
                whole = crc32c(data, whole)
                if crc32c(data) != expected_crc:
                    problems.append(
                        Problem(info.name, chunk.name, f"block {block} (bytes {start}..{end}) fails its CRC32C")
                    )
            if whole != chunk.crc32c:
                problems.append(Problem(info.name, chunk.name, "whole-chunk CRC32C mismatch"))
        if expected_start != info.flushed_length:
            problems.append(
                Problem(info.name, "", f"chunks end at {expected_start}, flushed length is {info.flushed_length}")
            )
    return FsckReport(len(infos), chunk_total, checked, problems)
