"""Query-string parameters of the HTTP API, checked, with the API's messages.

Invariant: a parameter that is present but not of its type is 400 ``invalid_argument``
naming the parameter, before anything runs; never a 500, never a silent default.
"""

from __future__ import annotations

import math

from starlette.requests import Request

from tierfs.contracts.errors import InvalidArgumentError

TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("", "0", "false", "no")


def query_int(request: Request, key: str, default: int | None = None) -> int | None:
    """A whole number >= 0, or ``default`` when the key is absent or empty."""
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"query parameter {key} must be an integer, not {raw!r}") from None
    if value < 0:
        raise InvalidArgumentError(f"query parameter {key} must be >= 0")
    return value


def query_seconds(request: Request, key: str, default: float, maximum: float) -> float:
    """A finite number of seconds within 0..``maximum``, or ``default`` when absent."""
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"query parameter {key} must be a number of seconds, not {raw!r}") from None
    if not (math.isfinite(value) and 0 <= value <= maximum):
        raise InvalidArgumentError(f"query parameter {key} must be within 0..{maximum:g} s, not {raw!r}")
    return value


def flag(request: Request, key: str) -> bool:
    """A boolean: 1/true/yes or 0/false/no (absent or empty: false); anything else is
    refused rather than guessed."""
    raw = request.query_params.get(key, "")
    if raw.lower() in TRUE_WORDS:
        return True
    if raw.lower() in FALSE_WORDS:
        return False
    raise InvalidArgumentError(f"query parameter {key} must be 1 or 0 (true/false), not {raw!r}")
