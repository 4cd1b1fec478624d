"""Whether the request being served was forwarded by another cluster daemon.

A daemon forwards a call for container ``c`` to that container's owner with the header
``FORWARDED_HEADER: c`` (``contracts.operations``); the owner's HTTP server sets
``forwarded_request`` to ``c``, and the router serves the whole request from its store
of ``c`` (a root listing or a flush of that container alone) or answers ``not_owner``,
so a request is forwarded at most once and two daemons with stale views never pass it
back and forth.
"""

from __future__ import annotations

import contextvars

# the container a forwarded request is for; None: a request from a client
forwarded_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("forwarded_request", default=None)
