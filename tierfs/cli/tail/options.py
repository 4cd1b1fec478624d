"""The grammar of ``tierfs tail``: GNU tail's options, parsed by argparse.

``tierfs tail [-f | -F | --follow=name|descriptor] [--retry] [-n [+]N | -c [+]N]
[-q | -v] [--pid PID] [-s S] PATH...``

- ``-n N`` / ``-c N``: the last N lines or bytes (default 10 lines); ``+N``: from line
  or byte N on (1 is the first; ``+0`` means the same). A leading ``-`` is GNU's
  spelling of "the last N". N takes units, as every size does (``-c 1KiB``, ``-n 2k``).
- ``-f`` / ``--follow`` / ``--follow=descriptor``: follow the segment each PATH names
  now, across renames; ``-F`` = ``--follow=name --retry``: follow the name, whatever
  segment it comes to hold. ``-q`` / ``-v`` never / always print ``==> PATH <==``
  headers (the last one given wins; by default they are printed for several PATHs).
- ``--pid PID``: with a follow, end once process PID has ended. ``-s`` is accepted for
  GNU compatibility; nothing polls for growth, so it changes nothing.

Invariant: imports only argparse and contracts (``tierfs --help`` stays quick, and the
parser builds this without importing trio or the client).
"""

from __future__ import annotations

import argparse
import dataclasses

from tierfs.cli.arguments import duration
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.units import parse_size

DEFAULT_LINES = 10
FOLLOW_NAME, FOLLOW_DESCRIPTOR = "name", "descriptor"
HEADERS_NEVER, HEADERS_ALWAYS = "never", "always"


@dataclasses.dataclass(frozen=True)
class Count:
    """``-n``/``-c``'s value: the last ``value`` units, or from unit ``value`` on."""

    value: int
    from_start: bool = False


def _count(text: str, what: str) -> Count:
    """``N``, ``-N`` (the last N), ``+N`` (from the Nth on); N with or without a unit."""
    stripped = text.strip()
    from_start = stripped.startswith("+")
    number = stripped[1:] if stripped[:1] in ("+", "-") else stripped
    if number[:-1].isdigit() and number.endswith("b"):  # GNU tail's b: 512-byte blocks
        return Count(int(number[:-1]) * 512, from_start)
    try:
        return Count(parse_size(number, "value"), from_start)
    except InvalidArgumentError:
        raise argparse.ArgumentTypeError(
            f"invalid number of {what}: {text!r} (a whole number, optionally with a unit: 10, 2k, 1MiB; "
            "+N counts from the start)") from None


def line_count(text: str) -> Count:
    return _count(text, "lines")


def byte_count(text: str) -> Count:
    return _count(text, "bytes")


def process_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid PID: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid PID: {text!r}")
    return value


def add_tail_arguments(p: argparse.ArgumentParser) -> None:
    """``tail``'s own options (its ``-v`` is GNU's: headers; ``tierfs -v tail`` still logs)."""
    p.add_argument("paths", nargs="+", metavar="path", help="segments to print (several: with headers)")
    p.add_argument("-f", dest="follow", action="store_const", const=FOLLOW_DESCRIPTOR,
                   help="follow each segment as it grows, across renames, until it is deleted")
    p.add_argument("--follow", dest="follow", action="store_const", const=FOLLOW_DESCRIPTOR,
                   help="the same as -f")
    p.add_argument("--follow=descriptor", dest="follow", action="store_const", const=FOLLOW_DESCRIPTOR,
                   help="the same as -f")
    p.add_argument("--follow=name", dest="follow", action="store_const", const=FOLLOW_NAME,
                   help="follow the name: when it is deleted, or comes to mean another segment "
                        "(log rotation), say so and follow the new one from its start")
    p.add_argument("-F", dest="follow_name_retry", action="store_true", help="--follow=name --retry")
    p.add_argument("--retry", action="store_true", help="keep trying a name that does not exist (yet)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("-n", "--lines", type=line_count, default=None, metavar="[+]N",
                       help=f"the last N lines (default {DEFAULT_LINES}), or +N: from line N on")
    group.add_argument("-c", "--bytes", type=byte_count, default=None, metavar="[+]N",
                       help="the last N bytes, or +N: from byte N on (units: 1KiB, 4k)")
    p.add_argument("-q", "--quiet", "--silent", dest="headers", action="store_const", const=HEADERS_NEVER,
                   help="never print ==> PATH <== headers")
    p.add_argument("-v", "--verbose", dest="headers", action="store_const", const=HEADERS_ALWAYS,
                   help="always print headers (tierfs -v tail ... logs more)")
    p.add_argument("--pid", type=process_id, metavar="PID", help="with -f/-F, end once process PID has ended")
    p.add_argument("-s", "--sleep-interval", type=duration, metavar="S",
                   help="accepted for GNU tail's scripts; growth wakes tierfs tail, nothing polls")


@dataclasses.dataclass(frozen=True)
class TailOptions:
    """``tail``'s parsed options, with GNU's defaults applied."""

    paths: tuple[str, ...]
    lines: Count | None  # one of lines and bytes is set
    bytes: Count | None
    follow: str | None  # FOLLOW_NAME, FOLLOW_DESCRIPTOR or None
    retry: bool
    headers: bool
    pid: int | None

    @classmethod
    def of(cls, args: argparse.Namespace) -> TailOptions:
        follow = FOLLOW_NAME if args.follow_name_retry else args.follow
        headers = args.headers == HEADERS_ALWAYS or (args.headers is None and len(args.paths) > 1)
        lines = None if args.bytes is not None else (args.lines or Count(DEFAULT_LINES))
        return cls(tuple(args.paths), lines, args.bytes, follow, args.retry or args.follow_name_retry,
                   headers, args.pid)
