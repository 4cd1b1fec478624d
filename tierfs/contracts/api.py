"""The public async API of a store: what the in-process ``SegmentStore`` and the
daemon's ``RemoteStore`` both offer, so front ends (the CLI) are written once.

Invariants:
- Both implementations take the same arguments and give the same results and errors
  (the daemon's errors are rebuilt as the same classes); ``tests/api_conformance.py``
  makes mypy fail when either drifts from these protocols.
- Names are store paths ('' is the root directory where a directory is accepted);
  lengths and offsets are bytes.
- Policy settings are values, never text: front ends parse ``KEY=VALUE`` with
  ``contracts.policy.parse_assignments`` before calling ``set_policy``.
"""

from __future__ import annotations

import builtins
from typing import Any, Protocol

from tierfs.contracts.reports.fsck import FsckReport
from tierfs.contracts.reports.gc import GcReport
from tierfs.contracts.reports.info import Info, SegmentInfo
from tierfs.contracts.writers import WriterSeq


class SegmentReaderAPI(Protocol):
    """One consumer's reader of one segment (the in-process one reads ahead)."""

    @property
    def name(self) -> str: ...

    async def read(self, offset: int, length: int | None = None, *, unconfirmed: bool = False) -> bytes:
        """Bytes from ``offset``, at most ``length``; b'' at the end."""
        ...


class SegmentStoreAPI(Protocol):
    async def create(
        self, name: str, *, durability: str | None = None, make_parents: bool = False
    ) -> SegmentInfo:
        """Create an empty segment ('pd', 'vd' or 'tier2'; default: the store's)."""
        ...

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None,
                     writer: WriterSeq | None = None) -> int:
        """Append ``data`` as one atomic record; returns its offset. With
        ``expected_offset``, only if the appended length is that (else BadOffsetError).
        With ``writer``: an append sent again is answered with its offset, not made
        twice (``contracts.writers``)."""
        ...

    async def read(
        self, name: str, offset: int = 0, length: int | None = None, *, unconfirmed: bool = False
    ) -> bytes:
        """Bytes up to the durable length (appended length with ``unconfirmed``)."""
        ...

    def open_reader(self, name: str) -> SegmentReaderAPI: ...

    async def stat(self, name: str) -> Info: ...

    async def chunk_layout(self, name: str) -> builtins.list[dict[str, Any]]:
        """A segment's chunks: name, URL, segment offset range, block CRCs (direct reads)."""
        ...

    async def list(self, name: str = "") -> builtins.list[Info]:
        """Entries directly inside a directory, sorted by name."""
        ...

    async def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None: ...

    async def rmdir(self, name: str) -> None: ...

    async def seal(self, name: str) -> SegmentInfo: ...

    async def unseal(self, name: str) -> SegmentInfo: ...

    async def delete(self, name: str) -> None: ...

    async def rename(self, old: str, new: str) -> None: ...

    async def rewrite(self, name: str) -> SegmentInfo:
        """Replace a segment by a new empty one (same durability, mode and owner) in one
        step, where its directory's policy has ``rewrite_replaces=1``; never a sealed one."""
        ...

    async def sync(self, name: str | None = None) -> int:
        """Make every appended byte durable; the segment's durable length."""
        ...

    async def flush(self, name: str | None = None) -> None:
        """Wait until tier-2 holds every byte durable now (of one segment or all)."""
        ...

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> int:
        """Wait until the durable length passes ``offset`` (or the timeout); returns it."""
        ...

    async def concat(
        self, target: str, sources: str | builtins.list[str], *, writer: str = "",
        writer_seq: int | None = None,
    ) -> SegmentInfo:
        """Append the sealed ``sources``, in order, to ``target`` and remove them."""
        ...

    async def set_durability(self, name: str, durability: str) -> SegmentInfo: ...

    async def set_attributes(
        self, name: str, *, mode: int | None = None, uid: int | None = None, gid: int | None = None,
        atime_ns: int | None = None, mtime_ns: int | None = None,
    ) -> Info:
        """Set permission bits, owner and times (metadata only; None leaves a value)."""
        ...

    async def offload(self, name: str, up_to: int | None = None) -> dict[str, Any]:
        """Start offloading sealed chunks; the job's status at once."""
        ...

    async def offload_status(self, name: str) -> dict[str, Any]: ...

    async def set_policy(self, name: str, assignments: dict[str, int | None]) -> dict[str, Any]:
        """Set (None: unset) policy keys on a directory; the policy as ``get_policy``."""
        ...

    async def get_policy(self, name: str) -> dict[str, Any]:
        """``{"path", "set": {key: value}, "effective": {key: {"value", "from"}}}``."""
        ...

    async def defrag(self, name: str) -> dict[str, Any]:
        """Merge the segment's runs of small adjacent chunks; what was merged."""
        ...

    async def fsck(self) -> FsckReport:
        """Verify every chunk's CRC32C and the metadata invariants."""
        ...

    async def gc(self, *, dry_run: bool = False, older_owners: bool = False) -> GcReport:
        """Delete (``dry_run``: list) orphan objects older than the grace period; with
        ``older_owners`` also those of the owners before a takeover from another data dir."""
        ...
