"""POSIX attributes of segments and directories: times, permission bits, owner.

What every front end reports (``stat``, ``ls``, the mount's getattr, fsspec ``info``)
comes from ``segment_info``/``directory_info`` here, and ``set_attributes`` is the one
way to change them (the mount's setattr/utimensat/chmod/chown, the API's
``set_attributes``, fsspec ``touch``).

Invariants:
- A segment's mtime is the time of its last acknowledged append within the durable
  length, or the last explicit set (``SegmentState.times_ns``); flushes, offloads,
  defrag, retention, restarts and stats never move it. ctime moves with appends and
  with every metadata change (seal, rename, durability, attributes); atime moves only
  when set (the store does not count reads).
- A directory's mtime and ctime move when an entry is added, removed or renamed in it
  (``touched``, committed in the same transaction as the change), or when set.
- Permission bits keep their meaning for appends: a segment with no write bit is
  sealed and a sealed one reports none; removing every write bit seals, giving the
  owner's write bit back unseals. Nothing else is enforced by the store: the kernel
  checks modes on the mount (``default_permissions``).
- Setting is metadata only: no byte of any segment changes. Sealed segments take new
  times and owners too (tools copy them after writing: ``cp -p``, ``rsync -a``).
- Bad values (negative, over the field's range, a mode with file-type bits) are refused
  before anything changes.
"""

from __future__ import annotations

import dataclasses
import os
import stat as stat_bits
from typing import Any

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.reports.info import DirectoryInfo, SegmentInfo
from tierfs.engine.clock import now_ns
from tierfs.engine.record_types import DirectoryMeta, SegmentMeta, SegmentRow
from tierfs.engine.segments.catalogue import ChunkCatalogue
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable

SEGMENT_DEFAULT_MODE = 0o644
DIRECTORY_DEFAULT_MODE = 0o755
WRITE_BITS = 0o222
PERMISSION_BITS = 0o7777
# Stored with a mode that was set, so that mode 0 (``chmod 0``) is not "never set" (the
# default); records from before it have none and a nonzero mode means what it says.
MODE_SET = 0o100000
MAX_ID = (1 << 32) - 2  # uid/gid: 32 bits, (uid_t)-1 means "unchanged" to chown(2)
MAX_TIME_NS = (1 << 64) - 1
# the daemon's own ids: the owner of everything whose owner was never set
PROCESS_UID, PROCESS_GID = os.getuid(), os.getgid()


def segment_mode(stored: int, sealed: bool) -> int:
    """The permission bits a segment reports: a sealed one has no write bit, an
    appendable one at least the owner's."""
    mode = stored_mode(stored, SEGMENT_DEFAULT_MODE)
    if sealed:
        return mode & ~WRITE_BITS
    return mode if mode & WRITE_BITS else mode | stat_bits.S_IWUSR


def stored_mode(stored: int, default: int) -> int:
    """The permission bits a record holds (``MODE_SET``), or ``default`` if never set."""
    if stored & MODE_SET:
        return stored & PERMISSION_BITS
    return stored or default


def segment_info(seg: SegmentState | SegmentRow) -> SegmentInfo:
    """What stat and ls show of a segment: from its state, or from its metadata row for
    a segment not in memory (which has no unflushed bytes: every length is flushed)."""
    if isinstance(seg, SegmentRow):
        record = seg.record
        durable = appended = record.flushed_length
        sealed = record.sealed
        mtime_ns, ctime_ns = record.modified_ns, record.changed_ns or record.modified_ns
    else:
        record = seg.record
        durable, appended, sealed = seg.durable_length, seg.appended_length, seg.sealed
        mtime_ns, ctime_ns = seg.times_ns()
    return SegmentInfo(
        name=seg.name,
        segment_id=seg.segment_id,
        length=durable,
        durable_length=durable,
        appended_length=appended,
        flushed_length=record.flushed_length,
        sealed=sealed,
        durability=record.durability,
        chunk_count=record.chunk_count,
        created=record.created_ns / 1e9,
        modified=mtime_ns / 1e9,
        start_offset=record.start_offset,
        mtime_ns=mtime_ns,
        atime_ns=record.accessed_ns or mtime_ns,
        ctime_ns=ctime_ns,
        mode=segment_mode(record.mode, sealed),
        uid=record.uid if record.owner_set else PROCESS_UID,
        gid=record.gid if record.owner_set else PROCESS_GID,
    )


def directory_info(name: str, record: DirectoryMeta, subdirectories: int = 0) -> DirectoryInfo:
    mtime_ns = record.modified_ns or record.created_ns
    return DirectoryInfo(
        name=name,
        created=record.created_ns / 1e9,
        modified=mtime_ns / 1e9,
        mtime_ns=mtime_ns,
        atime_ns=record.accessed_ns or mtime_ns,
        ctime_ns=record.changed_ns or mtime_ns,
        mode=stored_mode(record.mode, DIRECTORY_DEFAULT_MODE),
        uid=record.uid if record.owner_set else PROCESS_UID,
        gid=record.gid if record.owner_set else PROCESS_GID,
        subdirectories=subdirectories,
        directory_id=record.directory_id,
    )


def touched(record: DirectoryMeta, stamp_ns: int) -> DirectoryMeta:
    """``record`` after an entry was added, removed or renamed in it at ``stamp_ns``."""
    return dataclasses.replace(record, modified_ns=stamp_ns, changed_ns=stamp_ns)


@dataclasses.dataclass(frozen=True)
class AttributeChange:
    """What ``set_attributes`` changes; None leaves a value as it is."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None

    def __post_init__(self) -> None:
        for field, top in (("mode", PERMISSION_BITS), ("uid", MAX_ID), ("gid", MAX_ID),
                           ("atime_ns", MAX_TIME_NS), ("mtime_ns", MAX_TIME_NS)):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or not 0 <= value <= top):
                raise InvalidArgumentError(
                    f"{field} must be null or an integer in 0..{top:#o}" if field == "mode"
                    else f"{field} must be null or an integer in 0..{top}, not {value!r}"
                )

    def record_fields(self, current_uid: int, current_gid: int, owner_set: bool) -> dict[str, Any]:
        """The record fields to replace (times, mode, owner), with a new ctime."""
        fields: dict[str, Any] = {"changed_ns": now_ns()}
        if self.mode is not None:
            fields["mode"] = self.mode | MODE_SET
        if self.uid is not None or self.gid is not None:
            fields["owner_set"] = True
            fields["uid"] = self.uid if self.uid is not None else (current_uid if owner_set else PROCESS_UID)
            fields["gid"] = self.gid if self.gid is not None else (current_gid if owner_set else PROCESS_GID)
        if self.atime_ns is not None:
            fields["accessed_ns"] = self.atime_ns
        if self.mtime_ns is not None:
            fields["modified_ns"] = self.mtime_ns
        return fields


async def set_segment_attributes(
    catalogue: ChunkCatalogue, seg: SegmentState, change: AttributeChange
) -> None:
    """Store new attributes of a segment; a mode without write bits seals it, the
    owner's write bit on a sealed one unseals it (in the same commit)."""
    async with seg.meta_lock:
        record: SegmentMeta = seg.record
        fields = change.record_fields(record.uid, record.gid, record.owner_set)
        if change.mtime_ns is not None:  # appends so far are older than the time set
            fields["mtime_set_length"] = seg.appended_length
        if change.mode is not None:
            if not change.mode & WRITE_BITS and not record.sealed:
                fields["sealed"], fields["sealed_ns"] = True, now_ns()
            elif change.mode & stat_bits.S_IWUSR and record.sealed:
                fields["sealed"], fields["sealed_ns"] = False, 0
        if fields.get("sealed"):
            seg.sealing = True  # refuse appends from now while the commit runs
        try:
            await catalogue.update_record(seg, **fields)
        finally:
            seg.sealing = False


async def set_directory_attributes(
    catalogue: ChunkCatalogue, table: SegmentTable, name: str, change: AttributeChange
) -> None:
    async with table.lock:
        record = table.directory_record(name)
        updated = dataclasses.replace(record, **change.record_fields(record.uid, record.gid, record.owner_set))
        await catalogue.call(catalogue.metadata.update_directory, name, updated)
        table.set_directory_record(name, updated)
