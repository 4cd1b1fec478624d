"""argparse types of the ``tierfs`` command line: numbers are checked while parsing, so
``--offset -1`` or ``--length -5`` is a usage error (exit 2) naming the option, before
any store is opened.

Invariant: imports only argparse (``tierfs --help`` stays quick).
"""

from __future__ import annotations

import argparse


def non_negative_int(text: str) -> int:
    """An int >= 0 (offsets, lengths, counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; offsets and lengths are >= 0")
    return value
