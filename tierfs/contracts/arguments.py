"""Checks of numeric API arguments shared by the engine and the clients, so a bad
offset or length is the same ``invalid_argument`` with the same message in-process, over
the daemon and on the command line.

Invariant: a check raises before anything is read or written.
"""

from __future__ import annotations

from tierfs.contracts.errors import InvalidArgumentError


def check_non_negative(key: str, value: object, *, optional: bool = False) -> None:
    """Raise ``InvalidArgumentError`` unless ``value`` is an int >= 0 (or None when
    ``optional``); bool is not an int here."""
    if optional and value is None:
        return
    if type(value) is not int or value < 0:
        raise InvalidArgumentError(f"{key} must be an int >= 0, not {value!r}")


def check_read_window(offset: object, length: object) -> None:
    """A read's ``offset`` (int >= 0) and ``length`` (int >= 0 or None)."""
    check_non_negative("offset", offset)
    check_non_negative("length", length, optional=True)
