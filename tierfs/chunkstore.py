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
  are translated here, in one table: missing object -> ``ChunkMissingError``, anything
  else -> ``Tier2Error``.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from .errors import ChunkMissingError, InvalidArgumentError, Tier2Error

T = TypeVar("T")


def _translate(name: str, call: Callable[[], T]) -> T:
    try:
        return call()
    except FileNotFoundError as e:
        raise ChunkMissingError(f"chunk {name!r} is missing from tier-2: {e}") from e
    except (Tier2Error, InvalidArgumentError):
        raise
    except PermissionError as e:
        raise Tier2Error(f"tier-2 refused access to chunk {name!r}: {e}") from e
    except Exception as e:  # any backend failure: network, 5xx, disk
        raise Tier2Error(f"tier-2 failed on chunk {name!r}: {type(e).__name__}: {e}") from e


class ChunkStorage(abc.ABC):
    """Interface of a tier-2 chunk store (see module docstring for guarantees)."""

    supports_append = False
    supports_concat = False
    url = ""

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
        self.root = Path(root)
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

        _translate(name, call)

    def read(self, name: str, start: int, end: int) -> bytes:
        def call() -> bytes:
            with open(self._path(name), "rb") as f:
                return os.pread(f.fileno(), end - start, start)

        return _translate(name, call)

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass

        _translate(name, call)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            names = []
            for dirpath, _, files in os.walk(self.root):
                for file in files:
                    rel = os.path.relpath(os.path.join(dirpath, file), self.root)
                    if rel.startswith(prefix):
                        names.append(rel)
            return sorted(names)

        return _translate(prefix, call)

    def stat(self, name: str) -> int:
        return _translate(name, lambda: os.stat(self._path(name)).st_size)


class FsspecChunkStorage(ChunkStorage):
    """Chunks as whole objects on any fsspec filesystem (S3, memory, ...).

    Object stores cannot append, so every flush writes a new object with one PUT.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self.fs = fs
        self.root = root.rstrip("/")

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        if offset != 0:
            raise InvalidArgumentError(f"{self.url} cannot append to an existing chunk")
        _translate(name, lambda: self.fs.pipe_file(self._path(name), bytes(data)))

    def read(self, name: str, start: int, end: int) -> bytes:
        def call() -> bytes:
            data: bytes = self.fs.cat_file(self._path(name), start=start, end=end)
            return data

        return _translate(name, call)

    def delete(self, name: str) -> None:
        def call() -> None:
            try:
                self.fs.rm_file(self._path(name))
            except FileNotFoundError:
                pass

        _translate(name, call)

    def list(self, prefix: str = "") -> list[str]:
        def call() -> list[str]:
            try:
                found = self.fs.find(self.root)
            except FileNotFoundError:
                return []
            names = [p[len(self.root) + 1 :] for p in found]
            return sorted(n for n in names if n.startswith(prefix))

        return _translate(prefix, call)

    def stat(self, name: str) -> int:
        return _translate(name, lambda: int(self.fs.info(self._path(name))["size"]))


def open_chunk_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> ChunkStorage:
    """Chunk storage for a URL: a plain path or file:// is local, anything else fsspec."""
    protocol, _, rest = url.partition("://")
    if not _:
        return LocalChunkStorage(url)
    if protocol in ("file", "local"):
        return LocalChunkStorage(rest)
    try:
        return FsspecChunkStorage(url, storage_options)
    except (ImportError, ValueError) as e:
        raise InvalidArgumentError(f"cannot open tier-2 {url!r}: {e}") from e
