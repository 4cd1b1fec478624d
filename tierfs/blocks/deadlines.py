"""Reads of remote objects with a deadline: a stalled GET is abandoned and asked again,
never waited out.

Why: a ranged GET of one 1 MiB block from S3 normally completes in tens of
milliseconds, but now and then one request stalls for many seconds (a slow or
overloaded server, a lost connection nobody resets). Waiting for the HTTP client's read
timeout (15 s in s3fs, 60 s in botocore) makes one such request cost a reader 15-60 s;
a fresh request on a fresh connection almost always answers at once. So every read
gets a deadline proportional to the bytes it asks for (``DEFAULT_READ_DEADLINE_PER_MIB_S``
per MiB, at least one MiB's worth: about 1 s for a block), and the caller's retry loop
(``engine.tier2.calls.tier2_call``, the one retry table) asks again.

Invariants:
- A deadline cancels the request in the filesystem's own event loop (``asyncio.wait_for``
  through ``fsspec.asyn.sync``), so an abandoned GET closes its connection and holds no
  worker thread; it surfaces as ``ReadDeadlineError`` (a ``TimeoutError``, transient).
- A GET still unanswered after ``HEDGE_FRACTION`` of its deadline is *hedged*: a second
  GET of the same range starts beside it, the first to finish decides (its bytes, or
  its error for the retry loop) and the other is cancelled, so a stalled request usually costs a quarter of the deadline; at most two
  GETs per attempt are ever in flight.
- Successive attempts get longer deadlines (x1, x2, then x4: ``DeadlineSchedule``), so a
  store that is merely slow (a loaded machine, a long queue) still completes a read
  while a single stalled request costs about one deadline.
- ``open_read_filesystem`` gives an S3 filesystem without retries of its own (botocore
  one attempt, s3fs one try): retries of reads happen in one place, the caller's loop,
  which knows the deadline; writes keep the library's retries (``open_filesystem``).
- Filesystems that are not asynchronous (local, memory) are read directly: they do not
  stall on a network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import fsspec
import fsspec.asyn
from fsspec.exceptions import FSTimeoutError

from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.filesystems import open_filesystem

# 1 s per MiB: fifty times what a healthy S3 GET of a block takes, a tenth of a stall.
DEFAULT_READ_DEADLINE_PER_MIB_S = 1.0
DEADLINE_GROWTH = (1, 2, 4)  # the factor for the first, second and later attempts
# A GET not answered after a quarter of its deadline gets a twin (a hedged request):
# a healthy 1 MiB GET answers in well under 0.25 s, so twins are rare when nothing is
# wrong, and a stall costs a quarter of the deadline rather than all of it.
HEDGE_FRACTION = 0.25


class ReadDeadlineError(TimeoutError):
    """A read did not complete within its deadline (the caller retries it)."""


class DeadlineSchedule:
    """The deadlines of successive attempts at one read of ``size_bytes``."""

    def __init__(self, size_bytes: int, per_mib_s: float) -> None:
        self.base_s = per_mib_s * max(1.0, size_bytes / BLOCK_BYTES)
        self.attempts = 0

    def next_s(self) -> float:
        factor = DEADLINE_GROWTH[min(self.attempts, len(DEADLINE_GROWTH) - 1)]
        self.attempts += 1
        return self.base_s * factor


def _with_deadline(fs: Any, coroutine: Callable[..., Awaitable[Any]], deadline_s: float, *args: Any) -> Any:
    try:
        return fsspec.asyn.sync(fs.loop, coroutine, *args, timeout=deadline_s)
    except FSTimeoutError as e:
        raise ReadDeadlineError(f"no complete answer within {deadline_s:.1f} s (abandoned)") from e


async def _hedged_cat(fs: Any, path: str, start: int, end: int, hedge_after_s: float) -> bytes:
    """In the filesystem's loop: one GET, and a second of the same range if the first
    has not answered after ``hedge_after_s``. The first to finish decides: its bytes,
    or its error (the caller's retry loop asks again; waiting on for a request already
    known to be slow would only spend the deadline). The other is cancelled."""
    tasks = [asyncio.ensure_future(fs._cat_file(path, start=start, end=end))]
    try:
        done, _ = await asyncio.wait(tasks, timeout=hedge_after_s)
        if not done:
            tasks.append(asyncio.ensure_future(fs._cat_file(path, start=start, end=end)))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        succeeded = [task for task in done if task.exception() is None]
        data: bytes = (succeeded or list(done))[0].result()  # or the error
        return data
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # looked at: asyncio logs no "never retrieved"


def ranged_get(fs: Any, path: str, start: int, end: int, deadline_s: float) -> bytes:
    """Bytes ``[start, end)`` of ``path``, or ``ReadDeadlineError`` after ``deadline_s``;
    hedged after ``HEDGE_FRACTION`` of the deadline."""
    if not getattr(fs, "async_impl", False):
        data: bytes = fs.cat_file(path, start=start, end=end)
        return data
    hedged: bytes = _with_deadline(fs, _hedged_cat, deadline_s, fs, path, start, end, deadline_s * HEDGE_FRACTION)
    return hedged


def object_size(fs: Any, path: str, deadline_s: float) -> int:
    """The object's size (a HEAD), or ``ReadDeadlineError`` after ``deadline_s``."""
    if not getattr(fs, "async_impl", False):
        return int(fs.info(path)["size"])
    return int(_with_deadline(fs, fs._info, deadline_s, path)["size"])


def open_read_filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """A filesystem for reads: for S3 without retries of its own (see above)."""
    options = dict(storage_options or {})
    if fsspec.utils.get_protocol(url) not in ("s3", "s3a"):
        return open_filesystem(url, options)[0]
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1})
    options["config_kwargs"] = config
    options["skip_instance_cache"] = True  # its own instance: ``retries`` is set on it
    filesystem = open_filesystem(url, options)[0]
    filesystem.retries = 1  # s3fs's own retry loop: one try
    return filesystem
