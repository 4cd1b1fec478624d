"""Helpers shared by test modules (imported as ``helpers``; tests/ is not a package so
the repository root, which holds a folder named ``fuse``, never lands on sys.path)."""

from __future__ import annotations

from pathlib import Path

from tierfs import StoreConfig

KiB = 1 << 10


def small_config(data_dir: Path, **overrides: object) -> StoreConfig:
    """A config whose thresholds are small enough that tests see flushes, rollover
    of chunks and journal files, and VD syncs within milliseconds."""
    values: dict[str, object] = dict(
        data_dir=data_dir,
        flush_interval_s=0.05,
        flush_bytes=64 * KiB,
        max_chunk_bytes=256 * KiB,
        max_flush_bytes=128 * KiB,
        journal_file_bytes=128 * KiB,
        vd_sync_interval_s=0.2,
    )
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]
