"""Over the mount, a write sent again lands once: the same bytes at an offset below the
end are a no-op, anything else there is still EPERM (append-only)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from tierfs.testing.harness import Mount

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="FUSE tests need /dev/fuse and fusermount3 (apt install fuse3)",
)


def test_a_retried_write_lands_once(tmp_path: Path) -> None:
    mount = Mount(tmp_path / "data", tmp_path / "mnt")
    try:
        path = mount.path("retried.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            assert os.pwrite(fd, b"hello ", 0) == 6
            assert os.pwrite(fd, b"world", 6) == 5
            assert os.pwrite(fd, b"world", 6) == 5  # the same write again: no-op
            assert os.pwrite(fd, b"hello ", 0) == 6
            assert os.pwrite(fd, b"llo", 2) == 3
            for data, offset in ((b"WORLD", 6), (b"worlds", 6), (b"x", 3)):
                with pytest.raises(OSError) as refused:
                    os.pwrite(fd, data, offset)
                assert refused.value.errno == errno.EPERM
            assert os.pwrite(fd, b"!", 11) == 1
        finally:
            os.close(fd)
        assert path.read_bytes() == b"hello world!"
        assert mount.client().stat("retried.log").appended_length == 12
    finally:
        code, stderr = mount.unmount()
        assert code == 0, stderr
