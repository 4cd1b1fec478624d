"""``POST /v1/op/{op}``: one route for every operation of ``contracts.operations``.

The body is decoded and checked through the operation's table entry, the
``SegmentStoreAPI`` method it names is called, and its result is encoded the same way:
no operation has code of its own here.

Invariants:
- An unknown operation is 404 ``not_found`` before the body is read; a body that is
  not a JSON object is 400 ``invalid_argument``; a value of the wrong type is 400
  before the store is called (nothing changes).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.operations import OPERATIONS
from tierfs.server.statuses import error_response


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise InvalidArgumentError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidArgumentError("the body must be a JSON object")
    return body


class OperationRoute:
    def __init__(self, store: SegmentStoreAPI) -> None:
        self._store = store

    async def post(self, request: Request) -> Response:
        name = request.path_params["op"]
        operation = OPERATIONS.get(name)
        if operation is None:
            return error_response("not_found", f"no such operation {name!r}")
        args, kwargs = operation.call_arguments(await _json_object(request))
        result = await getattr(self._store, operation.method)(*args, **kwargs)
        return JSONResponse(operation.result.encode(result))
