"""``RemoteStore``: the store's async API (``contracts.api.SegmentStoreAPI``) served by a
daemon, for the CLI.

Invariants:
- The same method names, arguments, results and errors as the in-process store; every
  method that is a ``/v1/op`` operation goes through ``op`` and the operation table, so
  its wire form is written once (``contracts.operations``).
- Blocking HTTP calls run in worker threads; the event loop never waits on a socket.
- An append whose answer was lost is retried without ever landing twice
  (``exactly_once``).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from tierfs.contracts import operations as ops
from tierfs.contracts.arguments import check_read_window
from tierfs.contracts.errors import OffsetOutOfRangeError
from tierfs.contracts.operations import Operation
from tierfs.contracts.reports.fsck import FsckReport
from tierfs.contracts.reports.gc import GcReport
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.contracts.writers import WriterSeq
from tierfs.remote.client import TierClient
from tierfs.remote.exactly_once import BytesPayload, append_exactly_once

T = TypeVar("T")


class RemoteReader:
    """``SegmentReaderAPI`` over the daemon (its read-ahead happens in the daemon)."""

    def __init__(self, store: RemoteStore, name: str) -> None:
        self._store = store
        self.name = name

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        return await self._store.read(self.name, offset, length, unconfirmed=unconfirmed)


class RemoteStore:
    """The store's async API, served by a daemon (blocking calls run in threads)."""

    def __init__(self, client: TierClient) -> None:
        self.client = client

    async def _call(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn)

    async def op(self, operation: Operation[T], *args: Any, **kwargs: Any) -> T:
        """Call ``operation``'s API method in the daemon (``POST /v1/op/{name}``)."""
        return await self._call(lambda: self.client.call(operation, *args, **kwargs))

    # ------------------------------------------------------------ segments and reads
    async def create(self, name: str, *, durability: str | None = None, make_parents: bool = False) -> SegmentInfo:
        return await self.op(ops.CREATE, name, durability=durability, make_parents=make_parents)

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None,
                     writer: WriterSeq | None = None) -> int:
        """Lands once even if an answer is lost and the append is retried (``exactly_once``)."""
        payload = BytesPayload(data)
        return await self._call(lambda: append_exactly_once(
            self.client, name, payload, expected_offset, conditional=expected_offset is not None, writer=writer))

    async def read(self, name: str, offset: int = 0, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        check_read_window(offset, length)
        info = await self.stat(name)
        if not isinstance(info, SegmentInfo):  # the daemon's error for it, whatever the window
            return await self._call(lambda: self.client.read(name, offset, None, unconfirmed))
        limit = info.appended_length if unconfirmed else info.length
        if offset > limit:
            raise OffsetOutOfRangeError(name, offset, limit)
        end = None if length is None else offset + length
        return await self._call(lambda: self.client.read(name, offset, end, unconfirmed))

    def open_reader(self, name: str) -> RemoteReader:
        return RemoteReader(self, name)

    async def stat(self, name: str) -> Info:
        return await self.op(ops.STAT, name)

    async def list(self, name: str = "") -> builtins.list[Info]:
        return await self.op(ops.LS, name)

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        return await self.op(ops.LAYOUT, name)

    async def delete(self, name: str) -> None:
        await self.op(ops.DELETE, name)

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        _, durable = await self._call(lambda: self.client.follow_once(name, offset, timeout_s, 1))
        return durable

    # ------------------------------------------------------------ operations (/v1/op)
    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        await self.op(ops.MKDIR, name, parents=parents, exist_ok=exist_ok)

    async def rmdir(self, name: str) -> None:
        await self.op(ops.RMDIR, name)

    async def rename(self, old: str, new: str) -> None:
        await self.op(ops.MV, old, new)

    async def rewrite(self, name: str) -> SegmentInfo:
        return await self.op(ops.REWRITE, name)

    async def seal(self, name: str) -> SegmentInfo:
        return await self.op(ops.SEAL, name)

    async def unseal(self, name: str) -> SegmentInfo:
        return await self.op(ops.UNSEAL, name)

    async def sync(self, name: str | None = None) -> int:
        return await self.op(ops.SYNC, name)

    async def flush(self, name: str | None = None) -> None:
        await self.op(ops.FLUSH, name)

    async def set_durability(self, name: str, durability: str) -> SegmentInfo:
        return await self.op(ops.SET_DURABILITY, name, durability)

    async def set_attributes(
        self, name: str, *, mode: int | None = None, uid: int | None = None, gid: int | None = None,
        atime_ns: int | None = None, mtime_ns: int | None = None,
    ) -> Info:
        return await self.op(
            ops.SET_ATTRIBUTES, name, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns
        )

    async def concat(
        self, target: str, sources: str | builtins.list[str], *, writer: str = "", writer_seq: int | None = None
    ) -> SegmentInfo:
        return await self.op(ops.CONCAT, target, sources, writer=writer, writer_seq=writer_seq)

    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        return await self.op(ops.OFFLOAD, name, up_to)

    async def offload_status(self, name: str) -> dict[str, Any]:
        return await self.op(ops.OFFLOAD_STATUS, name)

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        return await self.op(ops.POLICY_SET, name, assignments)

    async def get_policy(self, name: str) -> dict[str, Any]:
        return await self.op(ops.POLICY_GET, name)

    async def defrag(self, name: str) -> dict[str, Any]:
        return await self.op(ops.DEFRAG, name)

    async def fsck(self) -> FsckReport:
        return await self.op(ops.FSCK)

    async def gc(self, *, dry_run: bool = False, older_owners: bool = False) -> GcReport:
        return await self.op(ops.GC, dry_run=dry_run, older_owners=older_owners)
