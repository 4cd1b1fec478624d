"""The long-term object store offloaded chunks move to (``--offload-to URL``).

It is a chunk storage (``tier2/chunk_storage.py``: same verbs, same error translation and
retries, reads with the same deadlines, messages naming "the long-term store") plus ``put``, which stores one whole
object with user metadata: on S3 as a parallel multipart upload (parts of
``offload_part_bytes``, ``offload_upload_concurrency`` at a time), elsewhere with one
write.

Invariants:
- ``put`` returns only when the object is durable in the store (S3: the multipart
  upload completed; a local directory: file and directory fdatasync'd), because the
  chunk-store copy may be deleted afterwards.
- ``delete`` calls ``before_delete`` first (the fence: a fenced store deletes nothing),
  and keeps a key ``keeps`` names (an older lineage's: ``engine/ownership/fencing.py``).
- Chunk records name offloaded objects by full URL; ``key_of`` maps a URL back to a key
  only under this store's URL, so a record never sends a read somewhere unexpected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tierfs.blocks.deadlines import DEFAULT_READ_DEADLINE_PER_MIB_S
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.engine.tier2.calls import tier2_call
from tierfs.engine.tier2.chunk_storage import (
    ChunkStorage,
    FsspecChunkStorage,
    LocalChunkStorage,
    open_chunk_storage,
)


class LongTermStore:
    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        part_bytes: int = 8 << 20,
        upload_concurrency: int = 8,
        read_deadline_per_mib_s: float = DEFAULT_READ_DEADLINE_PER_MIB_S,
    ) -> None:
        self.storage: ChunkStorage = open_chunk_storage(
            url, storage_options, read_deadline_per_mib_s=read_deadline_per_mib_s
        )
        self.storage.label = "long-term store"
        self.url = self.storage.url.rstrip("/")
        self.part_bytes = part_bytes
        self.upload_concurrency = upload_concurrency
        # called (blocking) right before every delete: the store's fence refuses
        # deletes once another owner claimed tier-2 (engine/ownership/fencing.py)
        self.before_delete: Callable[[], None] = lambda: None
        self.keeps: Callable[[str], bool] = lambda key: False  # shared with an older lineage

    def url_of(self, key: str) -> str:
        return f"{self.url}/{key}"

    def key_of(self, url: str) -> str:
        if not url.startswith(self.url + "/"):
            raise InvalidArgumentError(
                f"offloaded object {url} is not under the configured long-term store "
                f"{self.url}; start tierfs with --offload-to pointing at its store"
            )
        return url[len(self.url) + 1 :]

    def put(self, key: str, data: bytes, metadata: Mapping[str, str]) -> None:
        """Store ``data`` as object ``key`` (replacing any object of that key)."""
        storage = self.storage
        if isinstance(storage, LocalChunkStorage):
            storage.write(key, 0, data)  # fdatasync'd; metadata lives in the index record
            return
        assert isinstance(storage, FsspecChunkStorage)
        path = storage._path(key)
        fs = storage.fs
        if "s3" in fs.protocol:
            def call() -> None:
                fs.pipe_file(path, data, chunksize=self.part_bytes,
                             max_concurrency=self.upload_concurrency, Metadata=dict(metadata))
        else:
            def call() -> None:
                fs.pipe_file(path, data)
        tier2_call(key, call, label=storage.label)

    def read(self, key: str, start: int, end: int) -> bytes:
        return self.storage.read(key, start, end)

    def read_all(self, key: str) -> bytes:
        size = self.storage.stat(key)
        return self.storage.read(key, 0, size) if size else b""

    def delete(self, key: str) -> None:
        if self.keeps(key):  # an older lineage may reference it (engine/ownership/fencing.py)
            return
        self.delete_shared(key)

    def delete_shared(self, key: str) -> None:
        self.before_delete()
        self.storage.delete(key)

    def stat(self, key: str) -> int:
        return self.storage.stat(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.storage.list(prefix)
