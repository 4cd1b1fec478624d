"""The daemon's HTTP API (ASGI, Starlette routing, served by hypercorn on trio).

Routes (all under the daemon's Unix socket, or TCP with a bearer token):

    GET    /v1/health                         liveness + epoch
    GET    /metrics                           Prometheus text format
    GET    /v1/stat/{path}                    segment or directory info (JSON)
    GET    /v1/ls/{path}                      entries of a directory (JSON list)
    GET    /v1/layout/{path}                  chunk layout for direct readers
    PUT    /v1/segments/{path}                create (?durability=pd|vd&parents=1)
    POST   /v1/segments/{path}                append the body (?expected_offset=N) -> {"offset"}
    GET    /v1/segments/{path}                read; standard Range header; ?unconfirmed=1;
                                              ?follow=1&offset=N&timeout=S long-polls
    DELETE /v1/segments/{path}                delete
    POST   /v1/op/{mkdir|rmdir|mv|seal|unseal|sync|flush|set_durability|fsck}  JSON body
    POST   /v1/op/{offload|offload_status|policy_set|policy_get|concat}        JSON body

Invariants:
- Errors are JSON ``{"error": {"code", "message", "details"}}``; the code-to-status
  table ``STATUS_BY_CODE`` is the only place tierfs errors become HTTP statuses.
- Reads stream in bounded pieces through one ``SegmentReader`` (read-ahead), so a
  large GET never holds the whole range in memory.
- Names are validated by the engine (``names.canonical``) before anything happens;
  nothing here touches the journal or chunks directly.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tierfs.contracts.errors import (
    AppendTooLargeError,
    InvalidArgumentError,
    TierFSError,
    error_details,
)
from tierfs.contracts.info import SegmentInfo, info_json
from tierfs.contracts.policy import parse_assignments
from tierfs.store.facade import SegmentStore

log = logging.getLogger(__name__)

STATUS_BY_CODE = {
    "invalid_name": 400,
    "invalid_argument": 400,
    "not_a_directory": 400,
    "is_a_directory": 400,
    "unauthorized": 401,
    "sealed": 403,
    "not_found": 404,
    "exists": 409,
    "not_empty": 409,
    "conflict": 409,
    "bad_offset": 412,
    "too_large": 413,
    "out_of_range": 416,
    "truncated": 410,
    "already_running": 409,
    "already_committed": 409,
    "corrupt": 500,
    "journal_corrupt": 500,
    "internal": 500,
    "tier2": 502,
    "chunk_missing": 502,
    "backlog_full": 503,
    "closed": 503,
    "in_use": 503,
}
READ_PIECE_BYTES = 4 << 20  # one streamed piece of a GET: bounded memory per request
FOLLOW_MAX_TIMEOUT_S = 300.0
OPERATIONS = (
    "mkdir", "rmdir", "mv", "seal", "unseal", "sync", "flush", "set_durability", "fsck",
    "offload", "offload_status", "policy_set", "policy_get", "concat",
)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def error_response(code: str, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    status = STATUS_BY_CODE.get(code, 500)
    headers = {"Retry-After": "1"} if code == "backlog_full" else None
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


def _concat_arguments(args: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """``source`` (one name) or ``sources`` (a list, concatenated in order), and the
    optional ``writer``/``writer_seq`` transaction mark."""
    sources = args.get("sources", [args.get("source", "")])
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise InvalidArgumentError("sources must be a list of segment names")
    writer, writer_seq = args.get("writer", ""), args.get("writer_seq")
    if not isinstance(writer, str) or not (writer_seq is None or type(writer_seq) is int):
        raise InvalidArgumentError("writer must be a string and writer_seq an integer")
    return sources, {"writer": writer, "writer_seq": writer_seq}


def _query_int(request: Request, key: str, default: int | None = None) -> int | None:
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


def _flag(request: Request, key: str) -> bool:
    return request.query_params.get(key, "") in ("1", "true", "yes")


def parse_range(header: str, length: int) -> tuple[int, int] | None:
    """(start, end) for one ``bytes=`` range against ``length``; None if unsatisfiable."""
    match = _RANGE.match(header.strip())
    if not match or (match.group(1) == "" and match.group(2) == ""):
        raise InvalidArgumentError(f"unsupported Range header {header!r} (one bytes= range)")
    first, last = match.group(1), match.group(2)
    if first == "":
        start, end = max(0, length - int(last)), length
    else:
        start = int(first)
        end = length if last == "" else min(length, int(last) + 1)
    if start >= length and not (start == 0 and length == 0):
        return None
    return start, max(start, end)


class Metrics:
    """A Prometheus collector reading the store's statistics at scrape time."""

    def __init__(self, store: SegmentStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Any]:
        stats = self._store.statistics()
        counters: dict[str, tuple[str, float]] = {
            "tierfs_appends": ("appends acknowledged", stats.appends),
            "tierfs_appended_bytes": ("bytes appended", stats.appended_bytes),
            "tierfs_journal_syncs": ("journal fdatasync rounds", stats.journal_syncs),
            "tierfs_flushes": ("tier-2 flushes", stats.flushes),
            "tierfs_flushed_bytes": ("bytes flushed to tier-2", stats.flushed_bytes),
            "tierfs_flush_failures": ("failed tier-2 flushes", stats.flush_failures),
            "tierfs_cache_hits": ("block cache hits", stats.cache.hits),
            "tierfs_cache_misses": ("block cache misses", stats.cache.misses),
            "tierfs_cache_evictions": ("block cache evictions", stats.cache.evictions),
            "tierfs_tier2_gets": ("ranged GETs issued to tier-2", stats.cache.gets),
            "tierfs_tier2_fetched_bytes": ("bytes fetched from tier-2", stats.cache.fetched_bytes),
            "tierfs_offloaded_bytes": ("bytes offloaded to the long-term store", stats.offloaded_bytes),
            "tierfs_offloaded_chunks": ("chunks offloaded to the long-term store", stats.offloaded_chunks),
            "tierfs_offload_failures": ("failed offload jobs", stats.offload_failures),
            "tierfs_hot_copies_deleted": ("chunk-store copies deleted after offload", stats.hot_copies_deleted),
            "tierfs_retention_deleted_bytes": ("bytes deleted by retention", stats.retention_deleted_bytes),
        }
        gauges: dict[str, tuple[str, float]] = {
            "tierfs_segments": ("segments", stats.segments),
            "tierfs_journal_bytes": ("bytes in journal files", stats.journal_bytes),
            "tierfs_journal_files": ("journal files", stats.journal_files),
            "tierfs_flush_backlog_bytes": ("durable bytes not yet in tier-2", stats.unflushed_bytes),
            "tierfs_flush_lag_seconds": ("age of the oldest unflushed append", stats.flush_lag_s),
            "tierfs_tail_memory_bytes": ("unflushed bytes held in memory", stats.tail_memory_bytes),
            "tierfs_cache_bytes": ("bytes in the block cache", stats.cache.used_bytes),
            "tierfs_epoch": ("owner epoch of the data directory", stats.epoch),
            "tierfs_offload_oldest_waiting_seconds": (
                "age of the oldest sealed chunk a policy wants offloaded", stats.offload_oldest_waiting_s),
        }
        for family_type, table in ((CounterMetricFamily, counters), (GaugeMetricFamily, gauges)):
            for name, (text, value) in table.items():
                family = family_type(name, text)
                family.add_metric([], value)
                yield family


def build_app(store: SegmentStore) -> Starlette:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Metrics(store))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "epoch": store.epoch})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def stat(request: Request) -> Response:
        return JSONResponse(info_json(await store.stat(request.path_params["path"])))

    async def ls(request: Request) -> Response:
        entries = await store.list(request.path_params["path"])
        return JSONResponse([info_json(e) for e in entries])

    async def layout(request: Request) -> Response:
        return JSONResponse(await store.chunk_layout(request.path_params["path"]))

    async def create(request: Request) -> Response:
        info = await store.create(
            request.path_params["path"],
            durability=request.query_params.get("durability") or None,
            make_parents=_flag(request, "parents"),
        )
        return JSONResponse(info_json(info), status_code=201)

    async def append(request: Request) -> Response:
        limit = store.config.max_append_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise AppendTooLargeError(int(declared), limit)
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise AppendTooLargeError(len(body), limit)
        offset = await store.append(
            request.path_params["path"], bytes(body),
            expected_offset=_query_int(request, "expected_offset"),
        )
        return JSONResponse({"offset": offset, "length": len(body)})

    async def read(request: Request) -> Response:
        name = request.path_params["path"]
        if _flag(request, "follow"):
            return await follow(request, name)
        unconfirmed = _flag(request, "unconfirmed")
        info = await store.stat(name)
        if not isinstance(info, SegmentInfo):
            return error_response("is_a_directory", f"is a directory, not a segment: {name!r}")
        length = info.appended_length if unconfirmed else info.length
        start, end = 0, length
        status = 200
        headers = {"Accept-Ranges": "bytes", "X-Tierfs-Durable-Length": str(info.durable_length)}
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
        reader = store.open_reader(name)
        first = await reader.read(start, min(end - start, READ_PIECE_BYTES), unconfirmed=unconfirmed)

        async def pieces() -> AsyncIterator[bytes]:
            yield first
            offset = start + len(first)
            while offset < end:
                data = await reader.read(offset, min(end - offset, READ_PIECE_BYTES), unconfirmed=unconfirmed)
                if not data:
                    raise TierFSError(f"segment {name!r} shrank while being read")
                yield data
                offset += len(data)

        return StreamingResponse(pieces(), status_code=status, headers=headers,
                                 media_type="application/octet-stream")

    async def follow(request: Request, name: str) -> Response:
        offset = _query_int(request, "offset", 0) or 0
        timeout_s = float(request.query_params.get("timeout", "30"))
        if not 0 <= timeout_s <= FOLLOW_MAX_TIMEOUT_S:
            raise InvalidArgumentError(f"timeout must be within 0..{FOLLOW_MAX_TIMEOUT_S} s")
        max_bytes = _query_int(request, "max_bytes", READ_PIECE_BYTES) or READ_PIECE_BYTES
        durable = await store.wait_for_data(name, offset, timeout_s)
        data = b""
        if durable > offset:
            data = await store.read(name, offset, min(max_bytes, durable - offset))
        return Response(data, media_type="application/octet-stream", headers={
            "X-Tierfs-Offset": str(offset), "X-Tierfs-Durable-Length": str(durable)})

    async def delete(request: Request) -> Response:
        await store.delete(request.path_params["path"])
        return Response(status_code=204)

    async def operation(request: Request) -> Response:
        op = request.path_params["op"]
        if op not in OPERATIONS:
            return error_response("not_found", f"no such operation {op!r}")
        try:
            args = json.loads(await request.body() or b"{}")
        except ValueError:
            raise InvalidArgumentError("the body must be a JSON object") from None
        if not isinstance(args, dict):
            raise InvalidArgumentError("the body must be a JSON object")
        path = args.get("path", "")
        result: Any = None
        if op == "mkdir":
            await store.mkdir(path, parents=bool(args.get("parents")), exist_ok=bool(args.get("parents")))
        elif op == "rmdir":
            await store.rmdir(path)
        elif op == "mv":
            await store.rename(args.get("source", ""), args.get("target", ""))
        elif op in ("seal", "unseal"):
            result = info_json(await (store.seal(path) if op == "seal" else store.unseal(path)))
        elif op == "sync":
            result = {"durable": await store.sync(path or None)}
        elif op == "flush":
            await store.flush(path or None)
        elif op == "set_durability":
            result = info_json(await store.set_durability(path, str(args.get("durability", ""))))
        elif op == "concat":
            sources, mark = _concat_arguments(args)
            result = info_json(await store.concat(str(args.get("target", "")), sources, **mark))
        elif op == "offload":
            result = await store.offload(path, args.get("up_to"))
        elif op == "offload_status":
            result = await store.offload_status(path)
        elif op == "policy_set":
            settings = args.get("settings", [])
            if not isinstance(settings, list) or not all(isinstance(x, str) for x in settings):
                raise InvalidArgumentError("settings must be a list of 'key=value' strings")
            result = await store.set_policy(path, parse_assignments(settings))
        elif op == "policy_get":
            result = store.get_policy(path)
        else:  # fsck
            from tierfs.store.fsck import fsck

            report = await fsck(store)
            result = {
                "segments": report.segments, "chunks": report.chunks,
                "bytes_checked": report.bytes_checked,
                "problems": [dataclasses.asdict(p) for p in report.problems],
            }
        return JSONResponse(result if result is not None else {"ok": True})

    async def tierfs_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, TierFSError)
        return error_response(exc.code, str(exc), error_details(exc))

    async def unexpected_error(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return error_response("internal", f"internal error: {type(exc).__name__}")

    routes = [
        Route("/v1/health", health),
        Route("/metrics", metrics),
        Route("/v1/stat/{path:path}", stat),
        Route("/v1/ls/{path:path}", ls),
        Route("/v1/layout/{path:path}", layout),
        Route("/v1/segments/{path:path}", create, methods=["PUT"]),
        Route("/v1/segments/{path:path}", append, methods=["POST"]),
        Route("/v1/segments/{path:path}", read, methods=["GET"]),
        Route("/v1/segments/{path:path}", delete, methods=["DELETE"]),
        Route("/v1/op/{op}", operation, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={TierFSError: tierfs_error, Exception: unexpected_error},
    )


class BearerTokenAuth:
    """ASGI middleware: every request must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given, self._token):
                response = error_response("unauthorized", "missing or wrong bearer token")
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)
