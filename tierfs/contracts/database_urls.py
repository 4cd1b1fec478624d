"""Metadata database URLs: which backend a URL names, and its printable form.

Invariant: ``redacted_url`` is the only form of a database URL that reaches a message,
a log line, an API answer or a ``repr``: its password, if any, is replaced by ``***``.
"""

from __future__ import annotations

import urllib.parse

SQLITE_URL = "sqlite:"
POSTGRESQL_SCHEMES = ("postgresql://", "postgres://")


def is_postgresql_url(url: str) -> bool:
    return url.startswith(POSTGRESQL_SCHEMES)


def is_sqlite_url(url: str) -> bool:
    return url in ("", SQLITE_URL)


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (also one given as a
    ``password=`` query parameter)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        credentials, host = netloc.rsplit("@", 1)
        netloc = f"{credentials.split(':', 1)[0]}:***@{host}"
    query = urllib.parse.urlencode(
        [(key, "***" if key == "password" else value)
         for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)],
        safe="*/",
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
