"""Query-string parameters of the HTTP API, checked, with the API's messages."""

from __future__ import annotations

from starlette.requests import Request

from tierfs.contracts.errors import InvalidArgumentError


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


def flag(request: Request, key: str) -> bool:
    return request.query_params.get(key, "") in ("1", "true", "yes")
