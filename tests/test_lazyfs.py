"""The power-loss layer (``tierfs.testing.faults.lazyfs``) the chaos harness puts under a data
dir: unsynced writes are seen by every reader until the power cut and then gone,
whether the file was closed and forgotten by the kernel meanwhile or not; synced bytes,
and names, survive; a deleted file's unsynced writes never show in a new file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tierfs.testing.chaos.world import LazyLayer

pytestmark = [pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse"),
              pytest.mark.skipif(os.getuid() != 0, reason="drops the kernel's caches (/proc/sys/vm/drop_caches): root")]


def _forget_everything() -> None:
    """The kernel drops its cached dentries and inodes (FUSE forgets follow)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("2\n")


def test_unsynced_writes_outlive_close_and_go_at_the_power_cut(tmp_path: Path) -> None:
    layer = LazyLayer(tmp_path / "backing", tmp_path / "mnt")
    try:
        synced, unsynced = layer.mountpoint / "synced", layer.mountpoint / "unsynced"
        with open(synced, "wb") as f:
            f.write(b"kept")
            f.flush()
            os.fsync(f.fileno())
        unsynced.write_bytes(b"written, closed, never synced")
        for _ in range(20):  # the kernel's forgets reach the layer in their own time
            _forget_everything()
            time.sleep(0.05)
            assert unsynced.read_bytes() == b"written, closed, never synced"  # a page cache's view
        assert (layer.backing / "unsynced").read_bytes() == b""  # the disk's
        doomed = layer.mountpoint / "doomed"
        doomed.write_bytes(b"x" * 100)
        doomed.unlink()
        _forget_everything()
        fresh = layer.mountpoint / "fresh"
        fresh.write_bytes(b"")
        assert fresh.read_bytes() == b""  # whatever inode number it got
        layer.power_cut()
        assert synced.read_bytes() == b"kept"
        assert unsynced.exists() and unsynced.read_bytes() == b""  # names pass through
    finally:
        layer.close()
