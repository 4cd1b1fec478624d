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


def host_port(text: str) -> str:
    """``HOST:PORT`` for ``--listen``: a port is required (1-65535), an IPv6 host in []."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT with a port 1-65535, "
                                         "e.g. 127.0.0.1:7070")
    return text


def daemon_url(text: str) -> str:
    """``--url``: ``unix:///path/tierfs.sock`` or ``http://HOST:PORT``."""
    if text.startswith(("unix://", "http://", "https://")):
        return text
    hint = f"http://{text}" if ":" in text and "/" not in text else "unix:///path/to/tierfs.sock"
    raise argparse.ArgumentTypeError(f"{text!r} has no scheme: did you mean {hint}?")


def data_dir(text: str) -> str:
    """``--data-dir``: not empty (that would be the current directory), not a file."""
    import os.path

    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a directory (it is made if missing)")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory")
    return text


def policy_setting(text: str) -> str:
    """One ``KEY=VALUE`` of ``policy set``, checked while parsing (a usage error)."""
    from tierfs.contracts.policy import parse_assignments

    try:
        parse_assignments([text])
    except InvalidArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
