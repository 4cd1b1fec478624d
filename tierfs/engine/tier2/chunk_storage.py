"""Tier-2 chunk storage over any fsspec URL, with the PDP-34 verbs.

Verbs: write (create, or append at the exact current end where supported), read a
range, read a run of adjacent blocks (``read_blocks``: one request, each block handed
over as it arrives), delete, list, stat, merge (defrag: a new chunk from the leading bytes of others);
``list_objects`` (every object with its size and modification time, for orphan
collection). Capability flags tell the parts what they may do: ``supports_append``
(false for object stores: every flush becomes a new object), ``supports_concat`` and
``supports_native_merge`` (``merge`` copies inside the backend: ``copy_file_range``
locally, S3 multipart ``UploadPartCopy``; otherwise it reads and writes the bytes).

Invariants every backend gives:
- Chunk bytes are exactly the user's bytes; names are opaque and supplied by the caller.
- ``write`` returns only once the bytes are durable in the backend (local: fdatasync of
  file and directory; object stores: the PUT completed), because the journal bytes they
  replace are deleted afterwards.
- ``write(name, offset, data)`` with ``offset > 0`` writes at exactly that position
  (pwrite), so a retried append after a failure never duplicates bytes.
- ``merge(name, pieces)`` creates a new object and never changes its sources; like
  ``write`` it returns once the new object is durable, and a retry starts it afresh.
- Methods block; callers run them in worker threads under a limiter. Backend errors
  are translated in one place (``tier2.calls.tier2_call``): missing object -> ``ChunkMissingError``;
  access denied or an invalid request -> ``Tier2Error`` at once; anything transient
  (5xx, SlowDown/503, connection errors, timeouts) is retried with exponential backoff
  and jitter, ``Tier2Error`` only after the last attempt. Retries live here and nowhere
  else on the tier-2 path (the storage writer's own backoff starts after these).
- Reads of remote objects (``FsspecChunkStorage.read`` and ``stat``) have a deadline
  per attempt (``blocks.deadlines``: about 1 s per MiB asked, longer on later attempts):
  a GET silent after a quarter of it gets a twin (hedge), and at the deadline the
  attempt is abandoned and asked again at once, without backoff, so a stall costs a
  reader a fraction of a second. Reads get ``READ_RETRY_ATTEMPTS``, and their S3 client
  retries nothing itself, so the attempts here are all the attempts there are.
"""

from __future__ import annotations

import abc
import builtins
import errno
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tierfs.blocks.block_stream import BlockSink, Run, Span, read_run
from tierfs.blocks.checksums import BLOCK_BYTES
from tierfs.blocks.deadlines import (
    DEFAULT_READ_DEADLINE_PER_MIB_S,
    DeadlineSchedule,
    object_size,
    open_read_filesystem,
    ranged_get,
)
from tierfs.blocks.filesystems import open_filesystem
from tierfs.contracts.errors import InvalidArgumentError, Tier2Error
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.tier2.calls import StoredObject, modified_s, tier2_call
from tierfs.engine.tier2.s3_merge import MergeCounts, multipart_merge

T = TypeVar("T")
log = logging.getLogger(__name__)


# Reads are idempotent and a failed one is seen by a user: 8 attempts ride out ~6 s of
# refused connections, and fail on 503s only if eight come in a row (1 in 10**8 at 10 %).
READ_RETRY_ATTEMPTS = 8


class ChunkStorage(abc.ABC):
    """Interface of a tier-2 chunk store (see module docstring for guarantees)."""

    supports_append = False
    supports_concat = False
    supports_native_merge = False
    url = ""
    label = "tier-2"  # names the store in error messages

    @abc.abstractmethod
    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Create the chunk (offset 0) or write at exactly ``offset`` (append)."""

    @abc.abstractmethod
    def read(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the chunk."""

    def read_blocks(self, name: str, spans: Sequence[Span], on_block: BlockSink) -> None:
        """Adjacent ranges ``spans`` of the chunk, each handed to ``on_block(index, data)``
        in order as soon as it is read (``blocks.block_stream``). Here: one read of the
        whole range, split; remote stores stream it (one GET, block by block)."""
        start = spans[0][0]
        data = self.read(name, start, spans[-1][1])
        view = memoryview(data)
        for index, (span_start, span_end) in enumerate(spans):
            on_block(index, data if len(spans) == 1 else bytes(view[span_start - start : span_end - start]))

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Delete a chunk; deleting a missing chunk is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Chunk names starting with ``prefix`` (admin and fsck only, never hot paths)."""

    @abc.abstractmethod
    def stat(self, name: str) -> int:
        """Size in bytes of the stored object (may exceed the committed length)."""

    def list_objects(self) -> builtins.list[StoredObject]:
        """Every object under the store's URL with size and modification time (orphan
        collection only, never hot paths)."""
        raise InvalidArgumentError(f"the {self.label} at {self.url} cannot list its objects")

    def chunk_url(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        """Create chunk ``name`` from the first ``length`` bytes of each ``(source,
        length)``, in order. Here: read them and write the concatenation at once (in
        memory: defrag bounds a merge by ``max_chunk_bytes``); backends that can copy
        inside themselves override it and set ``supports_native_merge``."""
        data = b"".join(self.read(source, 0, length) for source, length in pieces)
        self.write(name, 0, data)
        return MergeCounts(rewritten_bytes=len(data))


# copy_file_range refuses these where the kernel or file system cannot copy in place
_NO_KERNEL_COPY_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_COPY_PIECE_BYTES = 1 << 20  # user-space fallback: 1 MiB at a time


def _copy_range(source_fd: int, target_fd: int, length: int, target_offset: int) -> int:
    """Copy the first ``length`` bytes of ``source_fd`` to ``target_offset`` inside the
    kernel (reflinks or server-side copies where the file system offers them), or
    through user space where it cannot; returns the bytes the kernel copied."""
    copied = kernel_copied = 0
    kernel_copy = True
    while copied < length:
        want = length - copied
        if kernel_copy:
            try:
                count = os.copy_file_range(source_fd, target_fd, want, copied, target_offset + copied)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY_ERRNOS:
                    raise
                kernel_copy = False
                continue
            kernel_copied += count
        else:
            data = os.pread(source_fd, min(want, _COPY_PIECE_BYTES), copied)
            count = os.pwrite(target_fd, data, target_offset + copied) if data else 0
        if count == 0:
            raise Tier2Error(f"a chunk file ended after {copied} of its {length} committed bytes")
        copied += count
    return kernel_copied


class LocalChunkStorage(ChunkStorage):
    """Chunks as files under a local directory (the default tier-2)."""

    supports_append = True
    supports_native_merge = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()  # chunk URLs must mean the same in other processes
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)  # owner-only, like every object in it
        self.url = f"file://{self.root}"

    def _path(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        def call() -> None:
            path = self._path(name)
            created = False
            if offset == 0:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                flags = os.O_WRONLY | os.O_CREAT
                created = True
            else:
                flags = os.O_WRONLY
            fd = os.open(path, flags, 0o600)
            try:
                view = memoryview(data)
                position = offset
                while view:
                    written = os.pwrite(fd, view, position)
                    view = view[written:]
                    position += written
                os.fdatasync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_directory(path.parent)

        tier2_call(name, call, label=self.label)

    def read(self, name: str, start: int, end: int) -> bytes:
        def call() -> bytes:
            with open(self._path(name), "rb") as f:
                return os.pread(f.fileno(), end - start, start)

        return tier2_call(name, call, label=self.label)

    def read_blocks(self, name: str, spans: Sequence[Span], on_block: BlockSink) -> None:
        delivered = 0

        def call() -> None:  # one pread per block, no copy; a retry resumes after the last
            nonlocal delivered
            with open(self._path(name), "rb") as f:
                for index in range(delivered, len(spans)):
                    start, end = spans[index]
                    data = os.pread(f.fileno(), end - start, start)
                    delivered = index + 1
                    on_block(index, data)

        tier2_call(name, call, label=self.label)

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass

        tier2_call(name, call, label=self.label)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            names = []
            for dirpath, _, files in os.walk(self.root):
                for file in files:
                    rel = os.path.relpath(os.path.join(dirpath, file), self.root)
                    if rel.startswith(prefix):
                        names.append(rel)
            return sorted(names)

        return tier2_call(prefix, call, label=self.label)

    def stat(self, name: str) -> int:
        return tier2_call(name, lambda: os.stat(self._path(name)).st_size, label=self.label)

    def list_objects(self) -> builtins.list[StoredObject]:
        def call() -> list[StoredObject]:
            found = []
            for dirpath, _, files in os.walk(self.root):
                for file in files:
                    path = os.path.join(dirpath, file)
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue  # deleted since the directory was read
                    found.append(StoredObject(os.path.relpath(path, self.root), st.st_size, st.st_mtime))
            return found

        return tier2_call("", call, label=self.label)

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        def call() -> int:
            path = self._path(name)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            kernel_copied = position = 0
            try:
                for source, length in pieces:
                    source_fd = os.open(self._path(source), os.O_RDONLY)
                    try:
                        kernel_copied += _copy_range(source_fd, fd, length, position)
                    finally:
                        os.close(source_fd)
                    position += length
                os.fdatasync(fd)
            finally:
                os.close(fd)
            fsync_directory(path.parent)
            return kernel_copied

        kernel_copied = tier2_call(name, call, label=self.label)
        total_bytes = sum(length for _, length in pieces)
        return MergeCounts(copied_natively_bytes=kernel_copied, rewritten_bytes=total_bytes - kernel_copied)


class FsspecChunkStorage(ChunkStorage):
    """Chunks as whole objects on any fsspec filesystem (S3, memory, ...).

    Object stores cannot append, so every flush writes a new object with one PUT.
    Reads go through ``read_fs`` with a deadline per attempt (module docstring).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        read_deadline_per_mib_s: float = DEFAULT_READ_DEADLINE_PER_MIB_S,
    ) -> None:
        self.url = url
        fs, root = open_filesystem(url, storage_options)
        self.fs = fs
        self.read_fs = open_read_filesystem(url, storage_options)
        self.read_deadline_per_mib_s = read_deadline_per_mib_s
        self.root = root.rstrip("/")
        # S3 merges with multipart part copies (s3fs gives the client calls)
        self.supports_native_merge = "s3" in _protocols(fs)

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        if offset != 0:
            raise InvalidArgumentError(f"{self.url} cannot append to an existing chunk")
        tier2_call(name, lambda: self.fs.pipe_file(self._path(name), bytes(data)), label=self.label)

    def read(self, name: str, start: int, end: int) -> bytes:
        path, deadlines = self._path(name), DeadlineSchedule(end - start, self.read_deadline_per_mib_s)
        return tier2_call(
            name, lambda: ranged_get(self.read_fs, path, start, end, deadlines.next_s()),
            attempts=READ_RETRY_ATTEMPTS, label=self.label,
        )

    def read_blocks(self, name: str, spans: Sequence[Span], on_block: BlockSink) -> None:
        """One ranged GET for all ``spans``, streamed block by block; an attempt that
        fails asks again for the blocks not yet handed over (``block_stream``)."""
        run = Run(self._path(name), spans, on_block)
        deadlines = DeadlineSchedule(BLOCK_BYTES, self.read_deadline_per_mib_s)  # per block
        tier2_call(
            name, lambda: read_run(self.read_fs, run, deadlines.next_s()),
            attempts=READ_RETRY_ATTEMPTS, label=self.label,
        )

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                pass

        tier2_call(name, call, label=self.label)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            try:
                found = self.fs.find(self.root)
            except FileNotFoundError:
                return []
            names = [p[len(self.root) + 1 :] for p in found]
            return sorted(n for n in names if n.startswith(prefix))

        return tier2_call(prefix, call, label=self.label)

    def stat(self, name: str) -> int:
        path, deadlines = self._path(name), DeadlineSchedule(0, self.read_deadline_per_mib_s)
        return tier2_call(
            name, lambda: object_size(self.read_fs, path, deadlines.next_s()),
            attempts=READ_RETRY_ATTEMPTS, label=self.label,
        )

    def list_objects(self) -> builtins.list[StoredObject]:
        def call() -> list[StoredObject]:
            self.fs.invalidate_cache(self.root)  # a cached listing could be hours old
            try:
                found = self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return []
            return [
                StoredObject(path[len(self.root) + 1 :], int(info.get("size") or 0), modified_s(info))
                for path, info in found.items()
                if info.get("type") != "directory"
            ]

        return tier2_call("", call, label=self.label)

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        if not self.supports_native_merge:
            return super().merge(name, pieces)
        bucket, key, _ = self.fs.split_path(self._path(name))
        prefix = key[: len(key) - len(name)]  # the tier-2 URL's key prefix

        def read(source_key: str, length: int) -> bytes:
            return self.read(source_key[len(prefix):], 0, length)

        def call() -> MergeCounts:
            keyed = [(prefix + source, length) for source, length in pieces]
            counts = multipart_merge(self.fs.call_s3, read, bucket, key, keyed)
            self.fs.invalidate_cache(self._path(name))
            return counts

        return tier2_call(name, call, label=self.label)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def open_chunk_storage(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    read_deadline_per_mib_s: float = DEFAULT_READ_DEADLINE_PER_MIB_S,
) -> ChunkStorage:
    """Chunk storage for a URL: a plain path or file:// is local, anything else fsspec
    (remote reads with ``read_deadline_per_mib_s``, see ``blocks.deadlines``)."""
    protocol, _, rest = url.partition("://")
    if not _:
        return LocalChunkStorage(url)
    if protocol in ("file", "local"):
        return LocalChunkStorage(rest)
    try:
        return FsspecChunkStorage(url, storage_options, read_deadline_per_mib_s=read_deadline_per_mib_s)
    except (ImportError, ValueError) as e:
        raise InvalidArgumentError(f"cannot open tier-2 {url!r}: {e}") from e
