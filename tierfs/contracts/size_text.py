"""Sizes as people read them: ``ls -h``'s ``1.5K`` (``human_size``) and a sentence's
``1.5 KiB`` (``readable_size``).

Invariant: imports nothing of tierfs (``errors`` words its messages with it).
"""

from __future__ import annotations

import math

_BINARY_UNITS = (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3), ("TiB", 1024**4), ("PiB", 1024**5))


def human_size(value: int) -> str:
    """A size as ``ls -h`` prints it: ``900``, ``1.5K``, ``12M``, ``3.0G`` (binary units,
    rounded up; one decimal below 10)."""
    if value < 1024:
        return str(value)
    for unit in "KMGTPE":
        value_in = value / 1024
        if value_in < 1024 or unit == "E":
            shown = math.ceil(value_in * 10) / 10 if value_in < 10 else math.ceil(value_in)
            return f"{shown:.1f}{unit}" if value_in < 10 else f"{shown}{unit}"
        value = value_in  # type: ignore[assignment]
    raise AssertionError("unreachable")


def readable_size(value: int) -> str:
    """A size for a sentence: ``32 bytes``, ``1.5 KiB``, ``64 MiB``, ``3.2 GiB``."""
    if value < 1024:
        return f"{value} byte" + ("" if value == 1 else "s")
    for unit, factor in _BINARY_UNITS:
        if value < factor * 1024 or unit == "PiB":
            shown = value / factor
            return f"{shown:.1f} {unit}" if shown < 10 and value % factor else f"{shown:.0f} {unit}"
    raise AssertionError("unreachable")
