"""Runs of adjacent 1 MiB blocks read with one ranged GET, each block handed over the
moment its bytes have arrived.

Why: a ranged GET costs the S3 client about 1 ms of CPU (request signing, botocore's
pipeline, response parsing) and the server a fixed cost before its first byte (s3rver:
~1.5 ms), whatever its size; the bytes cost ~0.7 ms (client) and ~1.3 ms (s3rver) per
MiB (docs/PERFORMANCE.md, "Sequential cold reads"). A sequential reader
that asks for 8-16 adjacent blocks in one request pays the fixed part once instead of
8-16 times. The block stays the unit of caching and checking: the body is read block by
block (``readexactly``: one ``bytes`` per block, no further copy) and each block goes
to the caller at once, so the first block of a 16 MiB run is usable after about one MiB's
transfer, not sixteen.

Invariants:
- ``on_block(index, data)`` is called for the spans in order, each at most once, with
  exactly the span's bytes (fewer only if the object ends early: the caller's length
  check reports it); ``RunProgress.delivered`` counts them, so a later attempt asks
  only for the blocks not yet handed over.
- Progress deadline: each block must arrive within ``block_deadline_s`` (the caller's
  deadline for one MiB, longer on later attempts), so a run of N blocks takes at most
  N deadlines and a stall is seen after one, whatever the run's size. A request silent
  for ``HEDGE_FRACTION`` of it gets a twin GET of the rest of the run; the first to
  bring the next block (or an error) decides and the other is closed, so at most two
  GETs of a run are ever in flight. At the deadline the attempt fails with
  ``ReadDeadlineError`` (the caller's retry loop asks again at once).
- S3 bodies are streamed in the filesystem's own asyncio loop; any other filesystem is
  read with one ranged read of the rest of the run (deadline scaled by its size) and
  split. Blocking: call from a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import fsspec.asyn

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.deadlines import HEDGE_FRACTION, ReadDeadlineError, ranged_get

Span = tuple[int, int]  # [start, end) in the object
BlockSink = Callable[[int, bytes], None]


@dataclasses.dataclass
class RunProgress:
    """How many blocks of a run were handed over (attempts resume after them)."""

    delivered: int = 0


@dataclasses.dataclass
class Run:
    """One ranged read of adjacent ``spans`` of object ``path``."""

    path: str
    spans: Sequence[Span]
    on_block: BlockSink
    progress: RunProgress = dataclasses.field(default_factory=RunProgress)

    @property
    def done(self) -> bool:
        return self.progress.delivered >= len(self.spans)

    def deliver(self, data: bytes) -> None:
        index = self.progress.delivered
        self.progress.delivered = index + 1
        self.on_block(index, data)


def streams_bodies(fs: Any) -> bool:
    """True for an asynchronous S3 filesystem (s3fs): its bodies can be streamed."""
    return bool(getattr(fs, "async_impl", False)) and hasattr(fs, "_call_s3")


def read_run(fs: Any, run: Run, block_deadline_s: float) -> None:
    """One attempt at the blocks of ``run`` not yet delivered (blocking)."""
    if run.done:
        return
    if streams_bodies(fs):
        fsspec.asyn.sync(fs.loop, _stream_run, fs, run, block_deadline_s)
    else:
        _read_whole_rest(fs, run, block_deadline_s)


def read_runs(fs: Any, runs: Sequence[Run], block_deadline_s: float, max_in_flight: int) -> None:
    """One attempt at several runs, at most ``max_in_flight`` at a time (blocking);
    the first error ends the call (runs keep what they delivered)."""
    if streams_bodies(fs):
        fsspec.asyn.sync(fs.loop, _stream_runs, fs, runs, block_deadline_s, max_in_flight)
        return
    for run in runs:
        read_run(fs, run, block_deadline_s)


def _read_whole_rest(fs: Any, run: Run, block_deadline_s: float) -> None:
    rest = run.spans[run.progress.delivered :]
    start, end = rest[0][0], rest[-1][1]
    data = ranged_get(fs, run.path, start, end, block_deadline_s * max(1.0, (end - start) / BLOCK_BYTES))
    view = memoryview(data)
    for span_start, span_end in rest:
        if span_start == start and span_end - span_start == len(data):
            run.deliver(data)  # the run was one block: no copy
        else:
            run.deliver(bytes(view[span_start - start : span_end - start]))


async def _stream_runs(fs: Any, runs: Sequence[Run], block_deadline_s: float, max_in_flight: int) -> None:
    slots = asyncio.Semaphore(max(1, max_in_flight))

    async def one(run: Run) -> None:
        async with slots:
            await _stream_run(fs, run, block_deadline_s)

    tasks = [asyncio.ensure_future(one(run)) for run in runs if not run.done]
    try:
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # looked at: asyncio logs no "never retrieved"


class _Body:
    """One GET of the run from block ``first`` to its end; opened on first use."""

    def __init__(self, fs: Any, run: Run, first: int) -> None:
        self._fs = fs
        self._run = run
        self._first = first
        self._body: Any = None

    async def read_block(self, index: int) -> bytes:
        start, end = self._run.spans[index]
        if self._body is None:
            bucket, key, version = self._fs.split_path(self._run.path)
            extra = {"VersionId": version} if version else {}
            response = await self._fs._call_s3(
                "get_object", Bucket=bucket, Key=key,
                Range=f"bytes={self._run.spans[self._first][0]}-{self._run.spans[-1][1] - 1}", **extra,
            )
            self._body = response["Body"]
        return await _read_exactly(self._body, end - start)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()  # a body not read to its end: the connection is dropped
            self._body = None


async def _read_exactly(body: Any, size: int) -> bytes:
    """``size`` bytes of a streaming body, as one ``bytes`` (aiohttp joins its pieces
    once); fewer only at the end of the body."""
    content = getattr(getattr(body, "raw_stream", None), "content", None)
    if content is not None and hasattr(content, "readexactly"):
        try:
            data: bytes = await content.readexactly(size)
        except asyncio.IncompleteReadError as e:  # the object ended early
            return e.partial
        return data
    pieces, got = [], 0
    while got < size:
        piece = await body.read(size - got)
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _stream_run(fs: Any, run: Run, block_deadline_s: float) -> None:
    hedge_after_s = block_deadline_s * HEDGE_FRACTION
    current = _Body(fs, run, run.progress.delivered)
    bodies = [current]
    try:
        while not run.done:
            index = run.progress.delivered
            reads = {asyncio.ensure_future(current.read_block(index)): current}
            try:
                done, _ = await asyncio.wait(reads, timeout=hedge_after_s)
                if not done:  # silent for a quarter of the deadline: a twin of the rest
                    twin = _Body(fs, run, index)
                    bodies.append(twin)
                    reads[asyncio.ensure_future(twin.read_block(index))] = twin
                    done, _ = await asyncio.wait(
                        reads, timeout=block_deadline_s - hedge_after_s, return_when=asyncio.FIRST_COMPLETED
                    )
                if not done:
                    raise ReadDeadlineError(
                        f"block {index + 1} of {len(run.spans)} of a ranged read of {run.path} did not "
                        f"arrive within {block_deadline_s:.1f} s (abandoned)"
                    )
                succeeded = [task for task in done if task.exception() is None]
                winner = (succeeded or list(done))[0]
                data = winner.result()  # or the error
            finally:
                for task in reads:
                    if not task.done():
                        task.cancel()
                    elif not task.cancelled():
                        task.exception()  # looked at: asyncio logs no "never retrieved"
            for body in bodies:  # the loser (if any) is dropped with its connection
                if body is not reads[winner]:
                    body.close()
            current = reads[winner]
            bodies = [current]
            run.deliver(data)
    finally:
        for body in bodies:
            body.close()
