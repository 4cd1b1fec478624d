"""The HTTP API's reads: ``GET /v1/segments/{path}`` with a ``Range`` header, and its
long-poll form ``?follow=1`` (tail reads).

Invariants:
- A read stops at the durable length (``?unconfirmed=1``: the appended length) and
  streams in ``READ_PIECE_BYTES`` pieces through one ``SegmentReader`` (read-ahead), so
  a large GET holds bounded memory whatever its range.
- A range that starts past the end is 416 ``out_of_range``, a malformed or reversed one
  416 ``invalid_range``, both with ``Content-Range: bytes */LEN``; a
  segment that shrinks under a streaming read fails it rather than sending fewer bytes
  than ``Content-Length`` promised.
- Every read answers ``ETag: "<segment id>"``; ``If-Match`` with another id (the name
  was deleted or replaced by a rename since the client opened it) is 404 ``not_found``
  before any byte is sent, and a name that moves to another segment during a streamed
  read fails that read: a client never gets bytes of two segments as one.
- A follow read waits at most ``FOLLOW_MAX_TIMEOUT_S`` and returns at most
  ``max_bytes`` new durable bytes, with the durable length in a header.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tierfs.contracts import names
from tierfs.contracts.errors import InvalidArgumentError, InvalidRangeError, TierFSError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.server.follow_stream import FollowStreams
from tierfs.server.query import flag, query_int, query_seconds
from tierfs.server.statuses import error_response
from tierfs.store.served import ServedStore

READ_PIECE_BYTES = 4 << 20  # one streamed piece of a GET: bounded memory per request
FOLLOW_MAX_TIMEOUT_S = 300.0
FOLLOW_DEFAULT_TIMEOUT_S = 30.0
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str, length: int) -> tuple[int, int] | None:
    """(start, end) for one ``bytes=`` range against ``length``; None if it starts past
    the end (416 ``out_of_range``). A malformed range, several ranges, or one that ends
    before it starts is ``InvalidRangeError`` (416 ``invalid_range``), never an empty
    206."""
    match = _RANGE.match(header.strip())
    if not match or (match.group(1) == "" and match.group(2) == ""):
        raise InvalidRangeError(header, length, "one 'bytes=first-last', 'bytes=first-' or 'bytes=-suffix'")
    first, last = match.group(1), match.group(2)
    if first == "":
        start, end = max(0, length - int(last)), length
    else:
        start = int(first)
        if last != "" and int(last) < start:
            raise InvalidRangeError(header, length, "the last byte is before the first")
        end = length if last == "" else min(length, int(last) + 1)
    if start >= length and not (start == 0 and length == 0):
        return None
    return start, max(start, end)


def matches(if_match: str | None, segment_id: int) -> bool:
    """RFC 9110 If-Match against the segment's ETag (its id): absent or ``*`` matches."""
    if if_match is None or if_match.strip() == "*":
        return True
    return f'"{segment_id}"' in (tag.strip() for tag in if_match.split(","))


class ReadRoutes:
    def __init__(self, store: ServedStore, streams: FollowStreams) -> None:
        self._store = store
        self._streams = streams

    async def read(self, request: Request) -> Response:
        name = request.path_params["path"]
        following, streamed, unconfirmed = flag(request, "follow"), flag(request, "stream"), flag(request, "unconfirmed")
        if streamed and (unconfirmed or not following):
            raise InvalidArgumentError("stream=1 is a form of follow=1 (durable bytes only): send follow=1, "
                                       "without unconfirmed=1")
        if following and not streamed:
            return await self.follow(request, name)
        opened = await self._opened(request, name)
        if isinstance(opened, Response):
            return opened
        info = opened
        if streamed:
            return self._streams.respond(request, name, info)
        length = info.appended_length if unconfirmed else info.length
        start, end = 0, length
        status = 200
        headers = {"Accept-Ranges": "bytes", "X-Tierfs-Durable-Length": str(info.durable_length),
                   "ETag": f'"{info.segment_id}"'}
        if "range" in request.headers:
            resolved = parse_range(request.headers["range"], length)
            if resolved is None:
                headers["Content-Range"] = f"bytes */{length}"
                response = error_response("out_of_range", f"range starts past the end ({length})")
                response.headers.update(headers)
                return response
            start, end = resolved
            status = 206
            headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{length}"
        headers["Content-Length"] = str(end - start)
        reader = self._store.open_reader(name)
        first = await reader.read(start, min(end - start, READ_PIECE_BYTES), unconfirmed=unconfirmed)

        async def pieces() -> AsyncIterator[bytes]:
            yield first
            offset = start + len(first)
            while offset < end:
                data = await reader.read(offset, min(end - offset, READ_PIECE_BYTES), unconfirmed=unconfirmed)
                if not data:
                    raise TierFSError(f"segment {name!r} shrank while being read")
                now = await self._store.stat(name)  # one stat per piece: in memory, or one call
                if not isinstance(now, SegmentInfo) or now.segment_id != info.segment_id:
                    raise TierFSError(f"segment {name!r} was replaced while being read")
                yield data
                offset += len(data)

        return StreamingResponse(pieces(), status_code=status, headers=headers,
                                 media_type="application/octet-stream")

    async def _opened(self, request: Request, name: str) -> SegmentInfo | Response:
        """The segment's info, or the error answer: a directory, or If-Match naming
        another segment."""
        names.canonical(name)  # '' is the root for stat, but no segment name (as in-process)
        info = await self._store.stat(name)
        if not isinstance(info, SegmentInfo):
            return error_response("is_a_directory", f"is a directory, not a segment: {name!r}")
        if not matches(request.headers.get("if-match"), info.segment_id):
            return error_response("not_found", f"{name!r} was deleted or replaced since it was opened "
                                               f"(If-Match {request.headers['if-match']}, now segment {info.segment_id})")
        return info

    async def follow(self, request: Request, name: str) -> Response:
        offset = query_int(request, "offset", 0) or 0
        timeout_s = query_seconds(request, "timeout", FOLLOW_DEFAULT_TIMEOUT_S, FOLLOW_MAX_TIMEOUT_S)
        max_bytes = query_int(request, "max_bytes", READ_PIECE_BYTES) or READ_PIECE_BYTES
        durable = await self._store.wait_for_data(name, offset, timeout_s)
        data = b""
        if durable > offset:
            data = await self._store.read(name, offset, min(max_bytes, durable - offset))
        return Response(data, media_type="application/octet-stream", headers={
            "X-Tierfs-Offset": str(offset), "X-Tierfs-Durable-Length": str(durable)})
