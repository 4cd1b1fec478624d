"""Errors on the wire: the facts an error carries, and the same class rebuilt from its
``code`` on the other side (``remote.client``), so callers cannot tell a local error
from a remote one.

Invariant: every ``TierFSError`` subclass of ``errors`` and ``cluster_errors`` is found
by its code; an unknown code becomes a plain ``TierFSError`` with the message.
"""

from __future__ import annotations

from tierfs.contracts import cluster_errors  # noqa: F401  (its classes are found as subclasses)
from tierfs.contracts.errors import TierFSError


def all_error_classes() -> dict[str, type[TierFSError]]:
    """Every error class by its stable ``code`` (for clients rebuilding remote errors)."""
    found: dict[str, type[TierFSError]] = {}
    pending: list[type[TierFSError]] = [TierFSError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def rebuild_error(code: str, message: str, details: dict[str, object] | None = None) -> TierFSError:
    """The error a remote tierfs reported, as the same class with the same message and
    facts (``expected``/``actual`` of ``BadOffsetError``, ...)."""
    cls = all_error_classes().get(code, TierFSError)
    error = cls.__new__(cls)
    error.args = (message,)
    for key, value in (details or {}).items():
        setattr(error, key, value)
    return error


def error_details(error: TierFSError) -> dict[str, object]:
    """The facts an error carries, JSON-ready (no message, no traceback)."""
    facts = ("name", "expected", "actual", "offset", "length", "backlog_bytes", "limit_bytes", "pid",
             "epoch", "new_epoch", "new_owner", "owner_id", "host", "data_dir", "claimed_at",
             "database", "reason", "container", "operation", "first", "second", "writer_seq")
    return {key: getattr(error, key) for key in facts if isinstance(getattr(error, key, None), (str, int))}
