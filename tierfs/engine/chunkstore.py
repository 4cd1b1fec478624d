"""Tier-2 chunk storage over any fsspec URL, with the PDP-34 verbs.

Verbs: write (create, or append at the exact current end where supported), read a
range, delete, list, stat. Capability flags tell the storage writer what it may do:
``supports_append`` (false for object stores: every flush becomes a new object) and
``supports_concat``.

Invariants every backend gives:
- Chunk bytes are exactly the user's bytes; names are opaque and supplied by the caller.
- ``write`` returns only once the bytes are durable in the backend (local: fdatasync of
  file and directory; object stores: the PUT completed), because the journal bytes they
  replace are deleted afterwards.
- ``write(name, offset, data)`` with ``offset > 0`` writes at exactly that position
  (pwrite), so a retried append after a failure never duplicates bytes.
- Methods block; callers run them in worker threads under a limiter. Backend errors
  are translated here, in one place (``_call``): missing object -> ``ChunkMissingError``;
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
import errno
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tierfs.blocks.deadlines import (
    DEFAULT_READ_DEADLINE_PER_MIB_S,
    DeadlineSchedule,
    object_size,
    open_read_filesystem,
    ranged_get,
)
from tierfs.blocks.filesystems import open_filesystem
from tierfs.contracts.errors import ChunkMissingError, InvalidArgumentError, Tier2Error

T = TypeVar("T")
log = logging.getLogger(__name__)


# 5 attempts, 50 ms doubling with jitter: rides out about 0.8 s of throttling or a
# dropped connection before the caller sees the error.
RETRY_ATTEMPTS = 5
RETRY_INITIAL_S = 0.05
# Reads are idempotent and a failed one is seen by a user: 8 attempts ride out ~6 s of
# refused connections, and fail on 503s only if eight come in a row (1 in 10**8 at 10 %).
READ_RETRY_ATTEMPTS = 8
_PERMANENT_ERRNOS = {errno.EINVAL, errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.ENOSPC}


def _is_transient(error: Exception) -> bool:
    if isinstance(error, (ValueError, TypeError, NotImplementedError)):
        return False
    if isinstance(error, OSError) and error.errno in _PERMANENT_ERRNOS:
        return False
    return True


def _call(name: str, call: Callable[[], T], attempts: int = RETRY_ATTEMPTS, label: str = "tier-2") -> T:
    delay_s = RETRY_INITIAL_S
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except FileNotFoundError as e:
            raise ChunkMissingError(f"object {name!r} is missing from the {label}: {e}") from e
        except (Tier2Error, InvalidArgumentError):
            raise
        except PermissionError as e:
            raise Tier2Error(f"the {label} refused access to {name!r}: {e}") from e
        except Exception as e:  # any backend failure: network, 5xx, disk
            if not _is_transient(e) or attempt == attempts:
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                raise Tier2Error(
                    f"the {label} failed on {name!r}{tries}: {type(e).__name__}: {e}"
                ) from e
            if isinstance(e, TimeoutError):  # a stalled request, not a busy store: ask again now
                log.info("%s timed out on %r, retry %d: %s", label, name, attempt, e)
                continue
            log.info("%s %s on %r, retry %d in %.2f s", label, type(e).__name__, name, attempt, delay_s)
            # real time: this runs in a worker thread (no trio clock there) and waits
            # for a real backend to recover
            time.sleep(delay_s * (0.5 + random.random()))
            delay_s *= 2
    raise AssertionError("unreachable")


class ChunkStorage(abc.ABC):
    """Interface of a tier-2 chunk store (see module docstring for guarantees)."""

    supports_append = False
    supports_concat = False
    url = ""
    label = "tier-2"  # names the store in error messages

    @abc.abstractmethod
    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Create the chunk (offset 0) or write at exactly ``offset`` (append)."""

    @abc.abstractmethod
    def read(self, name: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the chunk."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Delete a chunk; deleting a missing chunk is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Chunk names starting with ``prefix`` (admin and fsck only, never hot paths)."""

    @abc.abstractmethod
    def stat(self, name: str) -> int:
        """Size in bytes of the stored object (may exceed the committed length)."""

    def chunk_url(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"


class LocalChunkStorage(ChunkStorage):
    """Chunks as files under a local directory (the default tier-2)."""

    supports_append = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()  # chunk URLs must mean the same in other processes
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = f"file://{self.root}"

    def _path(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        def call() -> None:
            path = self._path(name)
            created = False
            if offset == 0:
                path.parent.mkdir(parents=True, exist_ok=True)
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
                dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)

        _call(name, call, label=self.label)

    def read(self, name: str, start: int, end: int) -> bytes:
        def call() -> bytes:
            with open(self._path(name), "rb") as f:
                return os.pread(f.fileno(), end - start, start)

        return _call(name, call, label=self.label)

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass

        _call(name, call, label=self.label)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            names = []
            for dirpath, _, files in os.walk(self.root):
                for file in files:
                    rel = os.path.relpath(os.path.join(dirpath, file), self.root)
                    if rel.startswith(prefix):
                        names.append(rel)
            return sorted(names)

        return _call(prefix, call, label=self.label)

    def stat(self, name: str) -> int:
        return _call(name, lambda: os.stat(self._path(name)).st_size, label=self.label)


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

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        if offset != 0:
            raise InvalidArgumentError(f"{self.url} cannot append to an existing chunk")
        _call(name, lambda: self.fs.pipe_file(self._path(name), bytes(data)), label=self.label)

    def read(self, name: str, start: int, end: int) -> bytes:
        path, deadlines = self._path(name), DeadlineSchedule(end - start, self.read_deadline_per_mib_s)
        return _call(
            name, lambda: ranged_get(self.read_fs, path, start, end, deadlines.next_s()),
            attempts=READ_RETRY_ATTEMPTS, label=self.label,
        )

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                pass

        _call(name, call, label=self.label)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            try:
                found = self.fs.find(self.root)
            except FileNotFoundError:
                return []
            names = [p[len(self.root) + 1 :] for p in found]
            return sorted(n for n in names if n.startswith(prefix))

        return _call(prefix, call, label=self.label)

    def stat(self, name: str) -> int:
        path, deadlines = self._path(name), DeadlineSchedule(0, self.read_deadline_per_mib_s)
        return _call(
            name, lambda: object_size(self.read_fs, path, deadlines.next_s()),
            attempts=READ_RETRY_ATTEMPTS, label=self.label,
        )


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
