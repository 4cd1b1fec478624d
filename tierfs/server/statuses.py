"""Errors as HTTP responses: ``STATUS_BY_CODE`` is the only place a tierfs error
becomes an HTTP status.

Invariants:
- Every error is JSON ``{"error": {"code", "message", "details"}}``; the code is the
  error's stable ``code`` and the details are its facts (``error_wire.error_details``), so
  a client rebuilds the same class (``error_wire.rebuild_error``).
- An unexpected exception answers ``internal`` (500) without its text, and is logged
  with its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tierfs.contracts.error_wire import error_details
from tierfs.contracts.errors import InvalidRangeError, TierFSError

log = logging.getLogger(__name__)

STATUS_BY_CODE = {
    "invalid_name": 400,
    "name_too_long": 400,
    "invalid_argument": 400,
    "not_a_directory": 400,
    "is_a_directory": 400,
    "unauthorized": 401,
    "sealed": 403,
    "append_only": 403,
    "not_found": 404,
    "exists": 409,
    "not_empty": 409,
    "conflict": 409,
    "bad_offset": 412,
    "too_large": 413,
    "out_of_range": 416,
    "invalid_range": 416,
    "truncated": 410,
    "already_running": 409,
    "already_committed": 409,
    "already_appended": 409,
    "metadata_damaged": 500,
    "corrupt": 500,
    "journal_corrupt": 500,
    "internal": 500,
    "tier2": 502,
    "chunk_missing": 502,
    "backlog_full": 503,
    "no_space": 507,  # Insufficient Storage: the journal disk is full
    "closed": 503,
    "metadata_unavailable": 503,
    "metadata_version": 500,
    "wrong_tier2": 409,  # the PostgreSQL metadata database does not answer
    "in_use": 503,
    "owned_elsewhere": 423,  # another owner claimed tier-2 (Locked)
    "fenced": 423,  # this store lost tier-2 to a newer owner (Locked)
    "no_backup": 404,
    "bad_metadata": 400,
    "store_not_empty": 409,
    "cross_container": 409,  # rename/concat across segment containers (EXDEV on the mount)
    "container_unavailable": 503,  # no owner for the container yet (failover)
    "not_owner": 503,  # a forwarded request reached a former owner
    "lease_lapsed": 503,  # the owner's lease lapsed before the acknowledgement: send it again
}


def error_response(code: str, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    status = STATUS_BY_CODE.get(code, 500)
    headers = {"Retry-After": "1"} if code in ("backlog_full", "no_space", "container_unavailable", "not_owner",
                                                   "lease_lapsed") else None
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


async def tierfs_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TierFSError)
    response = error_response(exc.code, str(exc), error_details(exc))
    if isinstance(exc, InvalidRangeError):  # RFC 9110: a 416 names the current length
        response.headers["Content-Range"] = f"bytes */{exc.length}"
    return response


async def unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return error_response("internal", f"internal error: {type(exc).__name__}")
