"""``tierfs --version``: this release and the parts a bug report needs (Python, pyfuse3,
the libfuse it runs on, fsspec, s3fs, pyspark), each "not installed" where it is not.

Invariant: reads package metadata and asks libfuse for its version through ctypes; it
imports none of those packages (``tierfs --version`` stays as quick as ``--help``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import platform

COMPONENTS = ("pyfuse3", "fsspec", "s3fs", "pyspark")


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def libfuse_version() -> str:
    """libfuse3's own version (``fuse_version()``: 3.16 is 316), or "not found"."""
    for candidate in ("libfuse3.so.3", ctypes.util.find_library("fuse3")):  # the soname first: no ldconfig
        if candidate is None:
            continue
        try:
            number = int(ctypes.CDLL(candidate).fuse_version())
            break
        except (OSError, AttributeError):
            continue
    else:
        return "not found"
    return f"{number // 100}.{number % 100}"


def version_text() -> str:
    parts = [f"{name} {_installed(name)}" for name in COMPONENTS]
    parts.insert(1, f"libfuse {libfuse_version()}")
    return f"tierfs {_installed('tierfs')}\npython {platform.python_version()}; " + "; ".join(parts) + "\n"
