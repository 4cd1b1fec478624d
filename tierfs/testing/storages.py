"""Chunk storages that wrap a real one, for tests and benchmarks: one that fails on
demand (``FlakyStorage``) and one that counts ranged reads (``CountingStorage``).

Put one in place of a store's tier-2 (``store.chunk_storage = CountingStorage(
store.chunk_storage)``) to see or disturb what the engine asks of tier-2.

Invariants:

- A wrapper is the storage it wraps to the engine: every verb is passed on unchanged
  (same arguments, same result, same error; ``read_blocks`` runs stream as the
  wrapped storage streams them), and the capability flags, URL and label
  are the wrapped storage's, so the engine takes the same decisions (append or one
  object per flush, chunk URLs handed to direct readers).
- The only differences are the documented ones: ``FlakyStorage.write`` raises
  ``Tier2Error`` while ``failing`` is set (without touching the wrapped storage), and
  ``CountingStorage.read`` records each call before passing it on.
- The counters are plain attributes, read and reset by the caller (the engine calls
  the verbs from worker threads; list appends and integer updates of one attribute are
  safe under the GIL, which is all a test needs).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence

from tierfs.contracts.errors import Tier2Error
from tierfs.engine.tier2.chunk_storage import ChunkStorage, StoredObject
from tierfs.engine.tier2.s3_merge import MergeCounts


class WrappedStorage(ChunkStorage):
    """Passes every verb to ``inner`` and shows its capability flags, URL and label."""

    def __init__(self, inner: ChunkStorage) -> None:
        self.inner = inner
        self.supports_append = inner.supports_append
        self.supports_concat = inner.supports_concat
        self.supports_native_merge = inner.supports_native_merge
        self.url = inner.url
        self.label = inner.label

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        self.inner.write(name, offset, data)

    def read(self, name: str, start: int, end: int) -> bytes:
        return self.inner.read(name, start, end)

    def read_blocks(self, name: str, spans: Sequence[tuple[int, int]], on_block: Callable[[int, bytes], None]) -> None:
        self.inner.read_blocks(name, spans, on_block)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def stat(self, name: str) -> int:
        return self.inner.stat(name)

    def list_objects(self) -> builtins.list[StoredObject]:
        return self.inner.list_objects()

    def chunk_url(self, name: str) -> str:
        return self.inner.chunk_url(name)

    def merge(self, name: str, pieces: Sequence[tuple[str, int]]) -> MergeCounts:
        if self.inner.supports_native_merge:
            return self.inner.merge(name, pieces)
        return super().merge(name, pieces)  # through this wrapper's read and write


class FlakyStorage(WrappedStorage):
    """Every ``write`` counts in ``attempts``; while ``failing`` (the default) it raises
    ``Tier2Error`` as a tier-2 outage would, and writes nothing. Clear ``failing`` to
    end the outage."""

    def __init__(self, inner: ChunkStorage, failing: bool = True) -> None:
        super().__init__(inner)
        self.failing = failing
        self.attempts = 0

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        self.attempts += 1
        if self.failing:
            raise Tier2Error("injected tier-2 outage")
        super().write(name, offset, data)


class CountingStorage(WrappedStorage):
    """Records every ranged read as ``(name, start, end)`` in ``reads``, in call order
    (a read that fails in the wrapped storage is recorded too: it was asked for); a
    ``read_blocks`` run is one read of its whole range."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.reads: list[tuple[str, int, int]] = []

    def read(self, name: str, start: int, end: int) -> bytes:
        self.reads.append((name, start, end))
        return super().read(name, start, end)

    def read_blocks(self, name: str, spans: Sequence[tuple[int, int]], on_block: Callable[[int, bytes], None]) -> None:
        self.reads.append((name, spans[0][0], spans[-1][1]))
        super().read_blocks(name, spans, on_block)
