"""The routes of ``contracts.operations``: ``POST /v1/op/{op}`` for every operation, and
each REST route the table gives (``Operation.rest``: stat, ls, layout, create, delete).

The body (or the URL's path and query string) is decoded and checked through the
operation's table entry, the ``SegmentStoreAPI`` method it names is called, and its
result is encoded the same way: no operation has code of its own here.

Invariants:
- An unknown operation is 404 ``not_found`` before the body is read; a body that is
  not a JSON object is 400 ``invalid_argument``; a value of the wrong type is 400
  before the store is called (nothing changes). A query-string value is read as the
  body's would be (``1``/``0``, ``true``/``false`` for a flag; an empty text is absent).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tierfs.contracts import operations as ops
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.operations import OPERATIONS, Operation
from tierfs.server.query import flag
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


def _query_body(operation: Operation[Any], request: Request) -> dict[str, Any]:
    """The JSON body a REST request stands for: its path, and its query string's keys."""
    body: dict[str, Any] = {"path": request.path_params["path"]}
    for param in operation.params[1:]:
        if param.name not in request.query_params:
            continue
        if param.codec is ops.FLAG:
            body[param.name] = flag(request, param.name)
        else:
            body[param.name] = request.query_params[param.name]
    return body


class RestRoute:
    """One operation at its REST route (``Operation.rest``)."""

    def __init__(self, store: SegmentStoreAPI, operation: Operation[Any]) -> None:
        assert operation.rest is not None and operation.params[0].name == "path"
        self._store = store
        self._operation = operation

    async def handle(self, request: Request) -> Response:
        operation, rest = self._operation, self._operation.rest
        assert rest is not None
        args, kwargs = operation.call_arguments(_query_body(operation, request))
        result = await getattr(self._store, operation.method)(*args, **kwargs)
        if rest.status == 204:
            return Response(status_code=204)
        return JSONResponse(operation.result.encode(result), status_code=rest.status)


def operation_routes(store: SegmentStoreAPI) -> list[Route]:
    """The REST route of every operation that has one, then ``/v1/op/{op}``."""
    routes = [
        Route(f"{operation.rest.prefix}/{{path:name}}", RestRoute(store, operation).handle,
              methods=[operation.rest.method])
        for operation in OPERATIONS.values() if operation.rest is not None
    ]
    return [*routes, Route("/v1/op/{op}", OperationRoute(store).post, methods=["POST"])]
