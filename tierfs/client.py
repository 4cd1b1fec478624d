"""Client of the daemon's HTTP API: a blocking ``TierClient`` (fsspec, Spark workers)
and an async ``RemoteStore`` facade with the engine's method names (the CLI).

Discovery: ``TIERFS_URL`` (``unix:///path/tierfs.sock`` or ``http://host:port`` with
``TIERFS_TOKEN``), else the socket in ``TIERFS_DATA_DIR`` or the default data dir.

Invariants:
- A non-2xx response becomes the same ``TierFSError`` subclass the daemon raised, with
  its message and facts (``errors.rebuild_error``): callers cannot tell local from remote.
- A daemon that cannot be reached is ``DaemonUnavailableError``, never a raw httpx error.
- Tokens go only into the Authorization header, never into URLs or logs.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import trio

from .config import default_data_dir
from .daemon import socket_path
from .errors import TierFSError, rebuild_error
from .store import DirectoryInfo, Info, SegmentInfo

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # long enough for a flush or an fsck; follow polls add their own


class DaemonUnavailableError(TierFSError, ConnectionError):
    """No daemon answers at the address tried."""

    code = "unavailable"


def info_from_json(data: dict[str, Any]) -> Info:
    if data.get("type") == "directory":
        return DirectoryInfo(name=data["name"], created=data["created"])
    return SegmentInfo(**data)


def discover_url(data_dir: str | os.PathLike[str] | None = None) -> str:
    """The daemon URL to use: explicit data dir > TIERFS_URL > TIERFS_DATA_DIR > default."""
    if data_dir is None and os.environ.get("TIERFS_URL"):
        return os.environ["TIERFS_URL"]
    directory = Path(data_dir or os.environ.get("TIERFS_DATA_DIR") or default_data_dir())
    return f"unix://{socket_path(directory.expanduser())}"


class TierClient:
    """Blocking client; safe to share between threads (httpx.Client is)."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url = url or discover_url()
        token = token or os.environ.get("TIERFS_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        if self.url.startswith("unix://"):
            transport = httpx.HTTPTransport(uds=self.url[len("unix://"):])
            self._http = httpx.Client(
                transport=transport, base_url="http://tierfs", headers=headers, timeout=timeout
            )
        else:
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise DaemonUnavailableError(f"no tierfs daemon at {self.url}: {e}") from None
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                raise TierFSError(f"HTTP {response.status_code} from {self.url}: {response.text[:200]}") from None
            raise rebuild_error(error["code"], error["message"], error.get("details"))
        return response

    @staticmethod
    def _path(name: str) -> str:
        return quote(name.lstrip("/"), safe="/")

    # --------------------------------------------------------------- namespace
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/v1/health").json()
        return result

    def metrics(self) -> dict[str, float]:
        """The daemon's Prometheus metrics as {sample name: value} (unlabelled samples)."""
        values = {}
        for line in self._request("GET", "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def stat(self, name: str) -> Info:
        return info_from_json(self._request("GET", f"/v1/stat/{self._path(name)}").json())

    def ls(self, name: str = "") -> list[Info]:
        return [info_from_json(e) for e in self._request("GET", f"/v1/ls/{self._path(name)}").json()]

    def layout(self, name: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", f"/v1/layout/{self._path(name)}").json()
        return result

    def create(self, name: str, durability: str | None = None, parents: bool = False) -> SegmentInfo:
        params = {"parents": "1" if parents else "0"}
        if durability:
            params["durability"] = durability
        info = info_from_json(self._request("PUT", f"/v1/segments/{self._path(name)}", params=params).json())
        assert isinstance(info, SegmentInfo)
        return info

    def delete(self, name: str) -> None:
        self._request("DELETE", f"/v1/segments/{self._path(name)}")

    def op(self, operation: str, **args: Any) -> Any:
        return self._request("POST", f"/v1/op/{operation}", json=args).json()

    # --------------------------------------------------------------- data
    def append(self, name: str, data: bytes, expected_offset: int | None = None) -> int:
        params = {} if expected_offset is None else {"expected_offset": str(expected_offset)}
        response = self._request("POST", f"/v1/segments/{self._path(name)}", content=data, params=params)
        return int(response.json()["offset"])

    def read(self, name: str, start: int = 0, end: int | None = None, unconfirmed: bool = False) -> bytes:
        """Bytes [start, end) (end None: to the durable end); b'' at or past the end."""
        if end is not None and end <= start:
            return b""
        headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        params = {"unconfirmed": "1"} if unconfirmed else {}
        try:
            response = self._request("GET", f"/v1/segments/{self._path(name)}", headers=headers, params=params)
        except TierFSError as e:
            if e.code == "out_of_range":
                return b""
            raise
        return response.content

    def follow_once(self, name: str, offset: int, timeout_s: float, max_bytes: int = 4 << 20) -> tuple[bytes, int]:
        """Long-poll: bytes from ``offset`` once some are durable (or b'' at the timeout),
        and the durable length."""
        params = {"follow": "1", "offset": str(offset), "timeout": str(timeout_s), "max_bytes": str(max_bytes)}
        response = self._request(
            "GET", f"/v1/segments/{self._path(name)}", params=params,
            timeout=httpx.Timeout(timeout_s + READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        )
        return response.content, int(response.headers["X-Tierfs-Durable-Length"])

    def follow(self, name: str, offset: int = 0, poll_timeout_s: float = 30.0) -> Iterator[bytes]:
        """Yield new durable bytes of a segment as they arrive, forever (tail -f)."""
        while True:
            data, _ = self.follow_once(name, offset, poll_timeout_s)
            if data:
                offset += len(data)
                yield data


class RemoteReader:
    def __init__(self, store: RemoteStore, name: str) -> None:
        self._store = store
        self.name = name

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        return await self._store.read(self.name, offset, length, unconfirmed=unconfirmed)


class RemoteStore:
    """The engine's async API, served by a daemon (blocking calls run in threads)."""

    def __init__(self, client: TierClient) -> None:
        self.client = client

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def create(self, name: str, *, durability: str | None = None, make_parents: bool = False) -> SegmentInfo:
        info: SegmentInfo = await self._call(self.client.create, name, durability, make_parents)
        return info

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None) -> int:
        offset: int = await self._call(self.client.append, name, data, expected_offset)
        return offset

    async def read(self, name: str, offset: int = 0, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        info = await self.stat(name)
        if isinstance(info, SegmentInfo):
            limit = info.appended_length if unconfirmed else info.length
            if offset > limit:
                from .errors import OffsetOutOfRangeError

                raise OffsetOutOfRangeError(name, offset, limit)
        end = None if length is None else offset + length
        data: bytes = await self._call(self.client.read, name, offset, end, unconfirmed)
        return data

    def open_reader(self, name: str) -> RemoteReader:
        return RemoteReader(self, name)

    async def stat(self, name: str) -> Info:
        info: Info = await self._call(self.client.stat, name)
        return info

    async def list(self, name: str = "") -> list[Info]:
        entries: list[Info] = await self._call(self.client.ls, name)
        return entries

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        await self._call(self.client.op, "mkdir", path=name, parents=parents)

    async def rmdir(self, name: str) -> None:
        await self._call(self.client.op, "rmdir", path=name)

    async def seal(self, name: str) -> None:
        await self._call(self.client.op, "seal", path=name)

    async def unseal(self, name: str) -> None:
        await self._call(self.client.op, "unseal", path=name)

    async def delete(self, name: str) -> None:
        await self._call(self.client.delete, name)

    async def rename(self, old: str, new: str) -> None:
        await self._call(self.client.op, "mv", source=old, target=new)

    async def sync(self, name: str | None = None) -> int:
        result = await self._call(self.client.op, "sync", path=name or "")
        return int(result["durable"])

    async def flush(self, name: str | None = None) -> None:
        await self._call(self.client.op, "flush", path=name or "")

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        _, durable = await self._call(self.client.follow_once, name, offset, timeout_s, 1)
        return int(durable)

    async def concat(
        self, target: str, sources: str | builtins.list[str], *, writer: str = "", writer_seq: int | None = None
    ) -> SegmentInfo:
        source_list = [sources] if isinstance(sources, str) else list(sources)
        info = info_from_json(await self._call(
            self.client.op, "concat", target=target, sources=source_list, writer=writer, writer_seq=writer_seq
        ))
        assert isinstance(info, SegmentInfo)
        return info

    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.op, "offload", path=name, up_to=up_to)
        return result

    async def offload_status(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.op, "offload_status", path=name)
        return result

    async def set_policy_settings(self, name: str, settings: builtins.list[str]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.op, "policy_set", path=name, settings=settings)
        return result

    async def get_policy(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.op, "policy_get", path=name)
        return result

    async def fsck_report(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(self.client.op, "fsck")
        return result


def connect_if_serving(data_dir: Path) -> TierClient | None:
    """A client of the daemon serving ``data_dir``, or None when none answers."""
    sock = socket_path(data_dir)
    if not sock.exists():
        return None
    client = TierClient(f"unix://{sock}")
    try:
        client.health()
    except DaemonUnavailableError:
        client.close()
        return None
    return client
