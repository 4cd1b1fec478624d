"""``RemoteStore``: the engine's async API served by a daemon, for the CLI.

Invariant: the same method names, arguments, results and errors as the in-process
store (``tierfs.contracts.api``); blocking HTTP calls run in worker threads.
"""

from __future__ import annotations

import builtins
from typing import Any

import trio

from tierfs.contracts.errors import OffsetOutOfRangeError
from tierfs.contracts.info import Info, SegmentInfo, info_from_json
from tierfs.remote.client import TierClient


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
