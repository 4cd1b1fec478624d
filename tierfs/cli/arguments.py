"""argparse types of the ``tierfs`` command line: numbers are checked while parsing, so
``--offset -1``, ``--length 5x`` or ``--deletion-lag soon`` is a usage error (exit 2)
naming the option, before any store is opened. Sizes and durations take units
(``4k``, ``64MiB``, ``30s``, ``4h``: ``tierfs.contracts.units``).

Invariant: imports only argparse and contracts (``tierfs --help`` stays quick).
"""

from __future__ import annotations

import argparse

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.units import parse_duration, parse_size


def non_negative_int(text: str) -> int:
    """An int >= 0 (counts, such as ``tail -n``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; offsets and lengths are >= 0")
    return value


def size(text: str) -> int:
    """Bytes >= 0, with or without a unit (offsets, lengths, sizes): ``4096``, ``4k``."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text} is negative; offsets and lengths are >= 0")
    try:
        return parse_size(text, "value")
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None


def duration(text: str) -> float:
    """Seconds >= 0, with or without units: ``30``, ``30s``, ``4h``, ``1h30m``."""
    try:
        return parse_duration(text, "value")
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None
