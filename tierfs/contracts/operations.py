"""The operation table: the data API's operations, once. Every one is served as
``POST /v1/op/{name}``; the namespace ones (stat, ls, layout, create, delete) also at
their REST route (``Rest``: ``GET /v1/stat/{path}``, ``PUT /v1/segments/{path}``, ...),
whose query-string keys are the operation's other parameters. Only appends and reads,
which carry bytes, have routes of their own.

An ``Operation`` names the ``SegmentStoreAPI`` method it calls, its parameters (the
JSON body's or query string's keys, their wire types, what an absent key means and how
each is passed to the method) and how its result travels. The daemon turns a body into
a call with ``call_arguments`` and the result into JSON with ``result.encode``; a client
does the reverse with ``body_of`` and ``result.decode``. Adding an operation is one
entry here and the engine method it calls (plus its line in ``SegmentStoreAPI`` and the
one-line ``RemoteStore`` method that make it typed): the daemon's routes and the
client's call follow from the entry.

Invariants:
- The wire format is docs/API.md's: no key is required (an absent name is "", which
  the engine rejects as ``invalid_name``), unknown keys are ignored, and an operation
  without a result answers ``{"ok": true}``.
- Decoding checks each value's type before anything is called and raises
  ``InvalidArgumentError`` with the message the API has always given: bad input
  changes nothing. Names are checked by the engine (``names.canonical``), not here.
- ``decode(encode(v)) == v`` for every value the API accepts, so a remote call means
  what the in-process one does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from tierfs.contracts.errors import InvalidArgumentError, TierFSError
from tierfs.contracts.policy import parse_assignments
from tierfs.contracts.reports.fsck import FsckReport, fsck_report_from_json, fsck_report_json
from tierfs.contracts.reports.gc import GcReport, gc_report_from_json, gc_report_json
from tierfs.contracts.reports.info import Info, SegmentInfo, info_from_json, info_json

T = TypeVar("T")

# A request one cluster daemon passes on to a container's owner carries this header
# (``cluster.forwarding``): the owner serves it itself or answers ``not_owner``.
FORWARDED_HEADER = "X-Tierfs-Forwarded"
# A cluster daemon calling another names itself (its daemon id) in this header and sends
# its own token (``cluster.host_credentials``): the other checks both against the registry.
HOST_HEADER = "X-Tierfs-Host"


@dataclasses.dataclass(frozen=True)
class Codec(Generic[T]):
    """A value's wire form: ``encode`` (API value -> JSON), ``decode`` (JSON -> API
    value, checked)."""

    type_name: str  # as a reader of the API sees it
    encode: Callable[[T], Any]
    decode: Callable[[Any], T]


@dataclasses.dataclass(frozen=True)
class Param:
    """One key of an operation's JSON body."""

    name: str
    codec: Codec[Any]
    default: Any  # the wire value of an absent key
    # The method's keyword arguments that get the value; () passes it positionally, in
    # table order. A client gives it under the first keyword: the others follow it.
    keywords: tuple[str, ...] = ()
    # A key that may hold one item instead of the list (``source`` for ``sources``).
    single: str = ""
    # Absent, the key leaves its keyword as an earlier key set it (``exist_ok`` follows
    # ``parents`` unless given: ``{"parents": true}`` has always meant ``mkdir -p``).
    absent_follows: bool = False

    def wire_value(self, body: Mapping[str, Any]) -> Any:
        if self.name in body:
            return body[self.name]
        if self.single and self.single in body:
            return [body[self.single]]
        return self.default


@dataclasses.dataclass(frozen=True)
class Rest:
    """An operation's REST route: ``{method} {prefix}/{path}``, the operation's first
    parameter (``path``) in the URL, the others in the query string; ``status`` on
    success (204: no body)."""

    method: str
    prefix: str
    status: int = 200


@dataclasses.dataclass(frozen=True)
class Operation(Generic[T]):
    name: str  # the {op} of /v1/op/{op}
    method: str  # the SegmentStoreAPI method it calls
    params: tuple[Param, ...]
    result: Codec[T]
    summary: str
    # the client waits for the answer as long as it takes (no read timeout): work that
    # grows with the store (fsck) or waits for tier-2 to answer (flush)
    unbounded: bool = False
    rest: Rest | None = None

    def call_arguments(self, body: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The method's positional and keyword arguments for a request body (checked)."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for param in self.params:
            if param.absent_follows and param.name not in body:
                continue
            value = param.codec.decode(param.wire_value(body))
            if param.keywords:
                kwargs.update(dict.fromkeys(param.keywords, value))
            else:
                args.append(value)
        return args, kwargs

    def body_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The request body for a call of the method with these arguments; a positional
        argument left out is left out of the body (its default applies)."""
        positional = [p for p in self.params if not p.keywords]
        if len(args) > len(positional):
            raise TypeError(f"{self.method}() takes {len(positional)} positional arguments")
        unknown = set(kwargs) - {k for p in self.params for k in p.keywords}
        if unknown:
            raise TypeError(f"{self.method}() got unexpected keyword arguments {sorted(unknown)}")
        body = {p.name: p.codec.encode(value) for p, value in zip(positional, args, strict=False)}
        for param in self.params:
            if param.keywords and param.keywords[0] in kwargs:
                body[param.name] = param.codec.encode(kwargs[param.keywords[0]])
        return body


def _same(value: Any) -> Any:
    return value


def _list_of_strings(message: str) -> Callable[[Any], list[str]]:
    def decode(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InvalidArgumentError(message)
        return list(value)

    return decode


def _boolean(value: Any) -> bool:
    # true/false, and the 1/0 the API has always taken; "yes", "false", 2 and null are
    # refused rather than guessed ("false" would be truthy).
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise InvalidArgumentError(f"a boolean (true or false) was expected, not {value!r}")


_WRITER_MESSAGE = "writer must be a string and writer_seq an integer"


def _writer(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(_WRITER_MESSAGE)
    return value


def _optional_int(value: Any) -> int | None:
    if not (value is None or type(value) is int):  # a bool is not a number here
        raise InvalidArgumentError(f"an integer or null was expected, not {value!r}")
    return value


def _writer_seq(value: Any) -> int | None:
    if not (value is None or type(value) is int):  # bool is not a sequence number
        raise InvalidArgumentError(_WRITER_MESSAGE)
    return value


_settings_list = _list_of_strings("settings must be a list of 'key=value' strings")


def _policy_settings(value: Any) -> dict[str, int | None]:
    return parse_assignments(_settings_list(value))


def _setting_strings(assignments: dict[str, int | None]) -> list[str]:
    return [f"{key}={'none' if value is None else value}" for key, value in assignments.items()]


def _optional_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"a string or null was expected, not {value!r}")
    return value


def _json_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TierFSError(f"expected a JSON list, got {value!r}")
    return value


def _segment_info(data: Any) -> SegmentInfo:
    info = info_from_json(data)
    if not isinstance(info, SegmentInfo):
        raise TierFSError(f"expected a segment's info, got {data!r}")
    return info


# ---------------------------------------------------------------- parameter types
NAME: Codec[str] = Codec("name", _same, _same)  # checked by the engine
# null (or no key) means every segment; '' is a name like any other, refused as in-process
OPTIONAL_NAME: Codec[str | None] = Codec("name or null (every segment)", _same, _same)
FLAG: Codec[bool] = Codec("bool", bool, _boolean)
TEXT: Codec[str] = Codec("string", _same, str)  # durability: checked by the engine
# absent, null or '' is None (the store's default durability)
OPTIONAL_TEXT: Codec[str | None] = Codec("string or null", _same, _optional_text)
OFFSET: Codec[int | None] = Codec("int or null", _same, _same)  # checked by the engine
SOURCES: Codec[list[str]] = Codec(
    "list of names",
    lambda sources: [sources] if isinstance(sources, str) else list(sources),
    _list_of_strings("sources must be a list of segment names"),
)
WRITER: Codec[str] = Codec("string", _same, _writer)
WRITER_SEQ: Codec[int | None] = Codec("int or null", _same, _writer_seq)
OPTIONAL_INT: Codec[int | None] = Codec("int or null", _same, _optional_int)
POLICY_SETTINGS: Codec[dict[str, int | None]] = Codec(
    "list of 'key=value' strings ('none' unsets)", _setting_strings, _policy_settings
)

# ---------------------------------------------------------------- result types
INFO: Codec[Info] = Codec("segment or directory info", info_json, info_from_json)
INFOS: Codec[list[Info]] = Codec(
    "list of infos", lambda infos: [info_json(i) for i in infos], lambda data: [info_from_json(i) for i in data]
)
CHUNK_LAYOUT: Codec[list[dict[str, Any]]] = Codec("list of chunks", _same, _json_list)
NOTHING: Codec[None] = Codec('{"ok": true}', lambda _: {"ok": True}, lambda _: None)
SEGMENT_INFO: Codec[SegmentInfo] = Codec("segment info", info_json, _segment_info)
DURABLE_LENGTH: Codec[int] = Codec(
    '{"durable": int}', lambda length: {"durable": length}, lambda data: int(data["durable"])
)
JSON_OBJECT: Codec[dict[str, Any]] = Codec("JSON object", _same, _same)
FSCK_REPORT: Codec[FsckReport] = Codec("fsck report", fsck_report_json, fsck_report_from_json)
GC_REPORT: Codec[GcReport] = Codec("gc report", gc_report_json, gc_report_from_json)

_PATH = Param("path", NAME, "")
_OPTIONAL_PATH = Param("path", OPTIONAL_NAME, None)

# ---------------------------------------------------------------- the namespace (REST routes too)
STAT = Operation("stat", "stat", (_PATH,), INFO, "a segment's or directory's info",
                 rest=Rest("GET", "/v1/stat"))
LS = Operation("ls", "list", (_PATH,), INFOS, "the entries directly inside a directory, by name",
               rest=Rest("GET", "/v1/ls"))
LAYOUT = Operation("layout", "chunk_layout", (_PATH,), CHUNK_LAYOUT,
                   "a segment's chunks: name, URL, offset range, block CRCs (direct reads)",
                   rest=Rest("GET", "/v1/layout"))
CREATE = Operation(
    "create", "create",
    (_PATH, Param("durability", OPTIONAL_TEXT, None, keywords=("durability",)),
     Param("parents", FLAG, False, keywords=("make_parents",))),
    SEGMENT_INFO, "create an empty segment (pd, vd or tier2; default: the store's); with parents "
    "also the missing directories", rest=Rest("PUT", "/v1/segments", 201),
)
DELETE = Operation("delete", "delete", (_PATH,), NOTHING, "delete a segment",
                   rest=Rest("DELETE", "/v1/segments", 204))

# ---------------------------------------------------------------- the operations
MKDIR = Operation(
    "mkdir", "mkdir",
    (_PATH, Param("parents", FLAG, False, keywords=("parents", "exist_ok")),
     Param("exist_ok", FLAG, False, keywords=("exist_ok",), absent_follows=True)),
    NOTHING, "create a directory; with parents also the missing ones; with exist_ok one that exists is fine",
)
RMDIR = Operation("rmdir", "rmdir", (_PATH,), NOTHING, "remove an empty directory")
MV = Operation(
    "mv", "rename", (Param("source", NAME, ""), Param("target", NAME, "")), NOTHING,
    "rename a segment or directory (metadata only)",
)
REWRITE = Operation(
    "rewrite", "rewrite", (_PATH,), SEGMENT_INFO,
    "replace a segment by a new empty one where the directory's policy has rewrite_replaces=1",
)
SEAL = Operation("seal", "seal", (_PATH,), SEGMENT_INFO, "make a segment read-only")
UNSEAL = Operation("unseal", "unseal", (_PATH,), SEGMENT_INFO, "make a sealed segment appendable")
SYNC = Operation(
    "sync", "sync", (_OPTIONAL_PATH,), DURABLE_LENGTH, "make every appended byte durable"
)
FLUSH = Operation("flush", "flush", (_OPTIONAL_PATH,), NOTHING, "wait until tier-2 holds every durable byte",
                  unbounded=True)
SET_DURABILITY = Operation(
    "set_durability", "set_durability", (_PATH, Param("durability", TEXT, "")), SEGMENT_INFO,
    "choose pd, vd or tier2 for an empty segment",
)
SET_ATTRIBUTES = Operation(
    "set_attributes", "set_attributes",
    (_PATH, *(Param(key, OPTIONAL_INT, None, keywords=(key,))
              for key in ("mode", "uid", "gid", "atime_ns", "mtime_ns"))),
    INFO, "set permission bits, owner and times of a segment or directory (metadata only)",
)
FSCK = Operation("fsck", "fsck", (), FSCK_REPORT, "verify every chunk and the metadata invariants",
                 unbounded=True)
GC = Operation(
    "gc", "gc", (Param("dry_run", FLAG, False, keywords=("dry_run",)),
                 Param("older_owners", FLAG, False, keywords=("older_owners",))), GC_REPORT,
    "delete (dry_run: list) unreferenced chunk and offload objects older than the grace period",
)
OFFLOAD = Operation(
    "offload", "offload", (_PATH, Param("up_to", OFFSET, None)), JSON_OBJECT,
    "start offloading the sealed chunks that end at or before up_to",
)
OFFLOAD_STATUS = Operation(
    "offload_status", "offload_status", (_PATH,), JSON_OBJECT, "the segment's offload job and progress"
)
POLICY_SET = Operation(
    "policy_set", "set_policy", (_PATH, Param("settings", POLICY_SETTINGS, [])), JSON_OBJECT,
    "set (none unsets) offload and retention keys on a directory",
)
POLICY_GET = Operation(
    "policy_get", "get_policy", (_PATH,), JSON_OBJECT, "the policy in effect and where each key comes from"
)
CONCAT = Operation(
    "concat", "concat",
    (
        Param("target", NAME, ""),
        Param("sources", SOURCES, [""], single="source"),
        Param("writer", WRITER, "", keywords=("writer",)),
        Param("writer_seq", WRITER_SEQ, None, keywords=("writer_seq",)),
    ),
    SEGMENT_INFO, "append sealed sources, in order, to target and remove them (metadata only)",
)
DEFRAG = Operation(
    "defrag", "defrag", (_PATH,), JSON_OBJECT,
    "merge a segment's runs of small adjacent chunks into large ones (one metadata swap per run)",
)

OPERATIONS: dict[str, Operation[Any]] = {
    op.name: op
    for op in (
        STAT, LS, LAYOUT, CREATE, DELETE, MKDIR, RMDIR, MV, REWRITE, SEAL, UNSEAL, SYNC, FLUSH, SET_DURABILITY, SET_ATTRIBUTES, FSCK, GC,
        OFFLOAD, OFFLOAD_STATUS, POLICY_SET, POLICY_GET, CONCAT, DEFRAG,
    )
}
