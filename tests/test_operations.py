"""The operation table (``contracts.operations``) and the ``/v1/op`` route it drives.

Every operation's arguments bind to its API method, bodies and results survive the
trip through JSON, bad values are refused with the API's messages before anything is
called, and the route answers as docs/API.md says (through ASGI, against an in-process
store)."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tierfs.contracts import operations as ops
from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.errors import InvalidArgumentError, TierFSError
from tierfs.contracts.operations import OPERATIONS
from tierfs.contracts.reports.fsck import FsckReport, Problem
from tierfs.contracts.reports.gc import LONG_TERM, TIER2, GcReport, OrphanObject
from tierfs.contracts.reports.info import DirectoryInfo, SegmentInfo, info_json
from tierfs.remote.remote_store import RemoteStore
from tierfs.server.http_api import build_app
from tierfs.store.facade import SegmentStore

# One call per operation, as a client of the API makes it: (positional, keyword).
SAMPLE_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "stat": (("a/b",), {}),
    "ls": (("a",), {}),
    "layout": (("s",), {}),
    "create": (("a/s",), {"durability": "vd", "make_parents": True}),
    "delete": (("s",), {}),
    "mkdir": (("a/b",), {"parents": True, "exist_ok": True}),
    "rmdir": (("a",), {}),
    "mv": (("a/x", "b/y"), {}),
    "rewrite": (("s",), {}),
    "seal": (("s",), {}),
    "unseal": (("s",), {}),
    "sync": (("s",), {}),
    "flush": ((None,), {}),
    "set_durability": (("s", "vd"), {}),
    "set_attributes": (("s",), {"mode": 0o600, "uid": 7, "gid": None, "atime_ns": 1, "mtime_ns": 2}),
    "fsck": ((), {}),
    "gc": ((), {"dry_run": True, "older_owners": False}),
    "offload": (("s", 1 << 20), {}),
    "offload_status": (("s",), {}),
    "policy_set": (("d", {"offload_after_s": 60, "retention_bytes": None}), {}),
    "policy_get": (("d",), {}),
    "concat": (("t", ["a", "b"]), {"writer": "job", "writer_seq": 3}),
    "defrag": (("s",), {}),
}


def test_every_operation_has_a_sample_call() -> None:
    assert set(SAMPLE_CALLS) == set(OPERATIONS)


@pytest.mark.parametrize("implementation", [SegmentStoreAPI, SegmentStore, RemoteStore])
@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_the_arguments_bind_to_the_api_method(name: str, implementation: type) -> None:
    operation = OPERATIONS[name]
    method = getattr(implementation, operation.method)
    assert inspect.iscoroutinefunction(method)
    args, kwargs = operation.call_arguments({})
    inspect.signature(method).bind(None, *args, **kwargs)  # TypeError if the table drifted
    sample_args, sample_kwargs = SAMPLE_CALLS[name]
    inspect.signature(method).bind(None, *sample_args, **sample_kwargs)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_call_survives_the_trip_through_json(name: str) -> None:
    operation = OPERATIONS[name]
    args, kwargs = SAMPLE_CALLS[name]
    body = json.loads(json.dumps(operation.body_of(args, kwargs)))
    assert operation.call_arguments(body) == (list(args), kwargs)


def test_wire_bodies_are_the_documented_ones() -> None:
    assert ops.MKDIR.body_of(["a"], {"parents": True, "exist_ok": False}) == {
        "path": "a", "parents": True, "exist_ok": False}
    assert ops.MV.body_of(["a", "b"], {}) == {"source": "a", "target": "b"}
    assert ops.SYNC.body_of([None], {}) == {"path": None}
    assert ops.CONCAT.body_of(["t", "s"], {"writer": "", "writer_seq": None}) == {
        "target": "t", "sources": ["s"], "writer": "", "writer_seq": None}
    assert ops.POLICY_SET.body_of(["", {"retention_s": 60, "offload_after_s": None}], {}) == {
        "path": "", "settings": ["retention_s=60", "offload_after_s=none"]}
    assert ops.FSCK.body_of([], {}) == {}
    with pytest.raises(TypeError):
        ops.SEAL.body_of(["a", "b"], {})
    with pytest.raises(TypeError):
        ops.SEAL.body_of(["a"], {"force": True})


def test_absent_keys_mean_what_they_always_meant() -> None:
    assert ops.MKDIR.call_arguments({}) == ([""], {"parents": False, "exist_ok": False})
    assert ops.MKDIR.call_arguments({"path": "d", "parents": 1}) == (["d"], {"parents": True, "exist_ok": True})
    assert ops.MKDIR.call_arguments({"path": "d", "parents": True, "exist_ok": False}) == (
        ["d"], {"parents": True, "exist_ok": False})
    assert ops.SYNC.call_arguments({"path": ""}) == ([""], {})  # a name, refused by the store
    assert ops.SYNC.call_arguments({}) == ([None], {})
    assert ops.FLUSH.call_arguments({"path": "s"}) == (["s"], {})
    assert ops.OFFLOAD.call_arguments({"path": "s"}) == (["s", None], {})
    assert ops.SET_DURABILITY.call_arguments({"path": "s", "durability": 5}) == (["s", "5"], {})
    assert ops.POLICY_SET.call_arguments({"path": "d"}) == (["d", {}], {})
    assert ops.CONCAT.call_arguments({}) == (["", [""]], {"writer": "", "writer_seq": None})
    assert ops.CONCAT.call_arguments({"target": "t", "source": "x"})[0] == ["t", ["x"]]
    assert ops.CONCAT.call_arguments({"sources": ["y"], "source": "x"})[0] == ["", ["y"]]
    assert ops.RMDIR.call_arguments({"path": "d", "unknown": 1}) == (["d"], {})


BAD_VALUES = [
    ("concat", {"target": "t", "sources": "s2"}, "sources must be a list of segment names"),
    ("concat", {"target": "t", "sources": ["a", 1]}, "sources must be a list of segment names"),
    ("concat", {"sources": ["a"], "writer": 5, "writer_seq": 1}, "writer must be a string and writer_seq an integer"),
    ("concat", {"sources": ["a"], "writer": "w", "writer_seq": "8"}, "writer must be a string and writer_seq an integer"),
    ("concat", {"sources": ["a"], "writer": "w", "writer_seq": True}, "writer must be a string and writer_seq an integer"),
    ("policy_set", {"path": "d", "settings": "retention_s=1"}, "settings must be a list of 'key=value' strings"),
    ("policy_set", {"path": "d", "settings": ["bogus=1"]}, "policy setting 'bogus=1'"),
    ("policy_set", {"path": "d", "settings": ["retention_s=-1"]}, "must be >= 0"),
]


@pytest.mark.parametrize("name, body, message", BAD_VALUES)
def test_bad_values_are_refused_with_the_api_messages(name: str, body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        OPERATIONS[name].call_arguments(body)


def test_results_survive_the_trip_through_json() -> None:
    info = SegmentInfo("s", 1, 5, 5, 7, 0, True, "vd", 0, 1.5, 2.5, start_offset=3)
    orphans = [OrphanObject(TIER2, "s00000001/e000001-c00000001", 10, 7200.5),
               OrphanObject(LONG_TERM, "s00000001/e000001-c00000001-u.data", 3, 0.0)]
    report = FsckReport(2, 3, 4096, [Problem("s", "s1/e1-c1", "block 0 fails"), Problem("t", "", "lengths")],
                        orphans)
    gc = GcReport(True, 3600.0, orphans, kept_young=1, kept_in_flight=2, kept_newer_epoch=3, failed=["x"])
    for codec, value in ((ops.SEGMENT_INFO, info), (ops.DURABLE_LENGTH, 11), (ops.FSCK_REPORT, report),
                         (ops.GC_REPORT, gc),
                         (ops.JSON_OBJECT, {"state": "NOT_RUN"}), (ops.NOTHING, None)):
        assert codec.decode(json.loads(json.dumps(codec.encode(value)))) == value
    assert ops.NOTHING.encode(None) == {"ok": True}
    with pytest.raises(TierFSError):
        ops.SEGMENT_INFO.decode(info_json(DirectoryInfo("d", 0.0)))


@pytest.fixture
async def api(store: SegmentStore) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://tierfs") as client:
        yield client


async def test_unknown_operations_and_bad_bodies(api: httpx.AsyncClient) -> None:
    response = await api.post("/v1/op/frobnicate", content=b"not json")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found", "message": "no such operation 'frobnicate'", "details": {}}
    for body in (b"{", b"[1]", b"3"):
        response = await api.post("/v1/op/mkdir", content=body)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "the body must be a JSON object"
    response = await api.post("/v1/op/mv", json={"target": "x"})  # no source: an empty name
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_name")


async def test_every_operation_through_the_route(api: httpx.AsyncClient, store: SegmentStore) -> None:
    async def op(name: str, **body: Any) -> Any:
        response = await api.post(f"/v1/op/{name}", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    assert await op("mkdir", path="d/e", parents=True) == {"ok": True}
    assert await op("mkdir", path="d/e", parents=True) == {"ok": True}  # parents: existing is fine
    await store.create("d/e/s")
    await store.append("d/e/s", b"hello ")
    assert await op("sync", path="d/e/s") == {"durable": 6}
    assert isinstance((await op("sync"))["durable"], int)
    assert await op("flush", path="d/e/s") == {"ok": True}
    sealed = await op("seal", path="d/e/s")
    assert sealed == info_json(await store.stat("d/e/s")) and sealed["sealed"] is True
    assert (await op("unseal", path="d/e/s"))["sealed"] is False
    await store.create("d/v")
    assert (await op("set_durability", path="d/v", durability="vd"))["durability"] == "vd"
    await store.append("d/v", b"world")
    await store.seal("d/v")
    joined = await op("concat", target="d/e/s", source="d/v")
    assert joined["length"] == 11 and await store.read("d/e/s") == b"hello world"
    assert await op("mv", source="d/e/s", target="d/s") == {"ok": True}
    assert await op("rmdir", path="d/e") == {"ok": True}
    policy = await op("policy_set", path="d", settings=["offload_after_s=60", "retention_s=none"])
    assert policy == await store.get_policy("d")
    assert policy["set"] == {"offload_after_s": 60}
    assert await op("policy_get", path="d/s") == await store.get_policy("d/s")
    assert (await op("offload_status", path="d/s"))["state"] == "NOT_RUN"
    # concat is metadata only: the source's chunk joined the target's
    assert await op("fsck") == {"segments": 1, "chunks": 2, "bytes_checked": 11, "problems": [],
                                "orphans": []}
    swept = await op("gc", dry_run=True)
    assert (swept["dry_run"], swept["orphans"], swept["orphan_bytes"]) == (True, [], 0)
    response = await api.post("/v1/op/offload", json={"path": "d/s"})  # no long-term store
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_argument")


async def test_a_refused_operation_changes_nothing(api: httpx.AsyncClient, store: SegmentStore) -> None:
    await store.create("t")
    await store.create("s")
    await store.append("s", b"source")
    await store.seal("s")
    for body in ({"target": "t", "sources": "s"}, {"target": "t", "sources": ["s"], "writer_seq": "1"}):
        response = await api.post("/v1/op/concat", json=body)
        assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_argument")
    response = await api.post("/v1/op/policy_set", json={"path": "", "settings": ["retention_s"]})
    assert response.status_code == 400
    assert await store.read("s") == b"source" and await store.read("t") == b""
    assert (await store.get_policy(""))["set"] == {}


async def test_the_rest_routes_follow_from_the_table(api: httpx.AsyncClient, store: SegmentStore) -> None:
    """stat, ls, layout, create and delete at their REST routes answer as their
    ``/v1/op`` form does, with the query string read as the body would be."""
    assert {op.name for op in OPERATIONS.values() if op.rest} == {"stat", "ls", "layout", "create", "delete"}
    created = await api.put("/v1/segments/d%2Fs", params={"durability": "vd", "parents": "1"})
    assert created.status_code == 201, created.text
    assert created.json() == info_json(await store.stat("d/s")) and created.json()["durability"] == "vd"
    await store.append("d/s", b"hello")
    await store.flush("d/s")
    for route, op in (("/v1/stat/d%2Fs", "stat"), ("/v1/ls/d", "ls"), ("/v1/layout/d%2Fs", "layout")):
        rest = await api.get(route)
        by_op = await api.post(f"/v1/op/{op}", json={"path": route.rpartition("/")[2].replace("%2F", "/")})
        assert rest.status_code == by_op.status_code == 200, (rest.text, by_op.text)
        assert rest.json() == by_op.json()
    assert len((await api.get("/v1/layout/d%2Fs")).json()) == 1
    refused = await api.put("/v1/segments/t", params={"parents": "maybe"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "query parameter parents must be 1 or 0 (true/false), not 'maybe'"
    assert (await api.get("/v1/stat/t")).json()["error"]["code"] == "not_found"  # the refusal changed nothing
    deleted = await api.delete("/v1/segments/d%2Fs")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert (await api.get("/v1/ls/d")).json() == []
