"""The HTTP API's health and append routes (reads are in ``reads``; every other route
follows from the operation table, in ``op_route``).

Invariants:
- An append is one request body, one atomic record: the body is refused as soon as it
  is known to exceed ``max_append_bytes`` (declared or streamed), before anything is
  written.
- Names are checked by the store (``names.canonical``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tierfs.contracts.errors import AppendTooLargeError
from tierfs.contracts.writers import WriterSeq
from tierfs.server.query import query_int
from tierfs.store.served import ServedStore


class SegmentRoutes:
    def __init__(self, store: ServedStore) -> None:
        self._store = store

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "epoch": self._store.epoch, "fenced": self._store.fence.fenced,
                             "max_append_bytes": self._store.config.max_append_bytes})

    async def append(self, request: Request) -> Response:
        limit = self._store.config.max_append_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise AppendTooLargeError(int(declared), limit)
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise AppendTooLargeError(len(body), limit)
        offset = await self._store.append(
            request.path_params["path"], bytes(body),
            expected_offset=query_int(request, "expected_offset"),
            writer=WriterSeq.parse(request.query_params.get("writer"), request.query_params.get("writer_seq")),
        )
        return JSONResponse({"offset": offset, "length": len(body)})

