"""lost+found: acknowledged bytes a store holds aside because they cannot be where they
belong; readable and restorable (``tierfs lost-found list|restore``,
``recovery.lost_found_records``).

Entries, each a data file with a JSON description beside it (``.json``: segment, byte
range, epoch, ``why``, and the writer identities of the appends it holds), or a whole
directory with ``LOST.json``:
- ``<segment>.e<epoch>``: what a fenced store acknowledged but never committed to
  tier-2 (``LostFound.save``, the fence's ``on_fenced``): when another owner takes
  tier-2 over, the old owner (a zombie still running) may hold acknowledged appends
  that never reached a chunk, durable in its journal, unknown to the new owner;
- ``<segment>.journal-<LSN>`` and ``journal/<file>@<offset>.damaged``: a journal repair
  (``recovery.journal_repair``);
- ``cNNN.lease-<epoch>/``: a cluster container's data dir whose lease another daemon
  took (``cluster.container_host``): its journal's frames.
fsck reports every entry, the metric ``tierfs_lost_found_bytes`` counts them, and
``tierfs owner`` lists them.

Invariants:
- Nothing acknowledged is dropped silently: the journal is synced first (appends in
  flight become durable), then every byte in ``[flushed length, appended length)`` of
  every segment is saved, read from the tail (memory or CRC-checked journal frames):
  a VD append is acknowledged before its sync, and a lapsed lease holds the durable
  length back (``Appender.on_durable``), so the durable length alone could miss some.
- The data file is fsynced before its description is written (atomically); an entry
  without a description is incomplete and reported as such.
- The journal keeps these bytes as well: a fenced store flushes nothing and truncates
  nothing, so its data dir still replays them.
- Memory stays bounded: bytes are copied in pieces of at most ``PIECE_BYTES``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from pathlib import Path
from typing import Protocol

import trio

from tierfs.blocks.checksums import crc32c
from tierfs.contracts.errors import TierFSError
from tierfs.engine.ownership.claims import OwnerClaim
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.table import SegmentTable
from tierfs.engine.segments.tail_reader import TailReader

log = logging.getLogger(__name__)

LOST_FOUND_DIR = "lost+found"
DESCRIPTION_SUFFIX = ".json"
PIECE_BYTES = 4 << 20  # bytes copied per step: bounded memory whatever the tail holds
FLUSH_WAIT_S = 10.0  # flushes already past their fence check finish first (bounded)


CONTAINER_DESCRIPTION = "LOST.json"  # a whole data dir kept aside (cluster.container_host)


@dataclasses.dataclass(frozen=True)
class LostFoundEntry:
    """One saved range, or directory (``description`` is None if it is missing)."""

    path: str  # relative to the data dir
    size: int
    description: dict[str, object] | None

    @property
    def segment(self) -> str:
        return str((self.description or {}).get("segment", ""))

    @property
    def why(self) -> str:
        facts = self.description or {}
        return str(facts.get("why") or facts.get("reason") or "no description")

    def line(self) -> str:
        """One line for people: where, what, how much, why."""
        facts = self.description or {}
        span = (f" offsets {facts['start_offset']}..{facts['end_offset']}"
                if "start_offset" in facts and "end_offset" in facts else "")
        epoch = facts.get("epoch", facts.get("lease_epoch"))
        owner = f" epoch {epoch}" if epoch is not None else ""
        if "container" in facts or ".lease-" in self.path.rpartition("/")[2]:  # a data dir kept aside
            return f"{self.path}: a container's journal of {self.size} bytes,{owner or ' epoch unknown'}, " \
                   f"not replayed: {self.why}"
        what = f"{self.segment}{span}" if self.segment else "(no segment)"
        return f"{self.path}: {self.size} bytes of {what}{owner}: {self.why}"


class SyncsJournal(Protocol):
    async def sync(self) -> int: ...


def entry_path(data_dir: Path, segment_name: str, epoch: int) -> Path:
    return data_dir / LOST_FOUND_DIR / f"{segment_name}.e{epoch:06d}"


def write_piece(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` of a lost+found file (owner-only), fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_description(path: Path, description: dict[str, object]) -> None:
    """Write (or replace) the ``.json`` description of lost+found file ``path``
    atomically, owner-only."""
    target = path.with_name(path.name + DESCRIPTION_SUFFIX)
    temporary = target.with_name(target.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(description, indent=1, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)


def entries(data_dir: Path) -> list[LostFoundEntry]:
    """Every entry under ``<data_dir>/lost+found`` (blocking): a directory with
    ``LOST.json`` is one entry."""
    root = data_dir / LOST_FOUND_DIR
    found = []
    for dirpath, dirnames, files in os.walk(root):
        # a container data dir kept aside is one entry: described, or (kept by a release
        # that described it after moving it, and stopped between) a journal dir with a LOCK
        if CONTAINER_DESCRIPTION in files or (Path(dirpath) != root and "journal" in dirnames and "LOCK" in files):
            directory = Path(dirpath)
            try:
                description = json.loads((directory / CONTAINER_DESCRIPTION).read_text())
            except (OSError, ValueError):
                description = None
            size = sum(p.stat().st_size for p in (directory / "journal").glob("*.jnl")) \
                if (directory / "journal").is_dir() else 0
            found.append(LostFoundEntry(str(directory.relative_to(data_dir)), size, description))
            dirnames.clear()  # its files are its own
            continue
        for file in sorted(files):
            if file.endswith((DESCRIPTION_SUFFIX, ".tmp")):
                continue
            path = Path(dirpath) / file
            description = None
            try:
                description = json.loads(path.with_name(file + DESCRIPTION_SUFFIX).read_text())
            except (FileNotFoundError, ValueError):
                pass
            found.append(LostFoundEntry(str(path.relative_to(data_dir)), path.stat().st_size, description))
    return sorted(found, key=lambda e: e.path)


class LostFound:
    """Saves a fenced store's unflushed acknowledged bytes (see the module docstring)."""

    def __init__(self, data_dir: Path, epoch: int, table: SegmentTable, tail: TailReader,
                 journal: SyncsJournal) -> None:
        self._data_dir = data_dir
        self._epoch = epoch
        self._table = table
        self._tail = tail
        self._journal = journal
        self.saved_bytes = 0

    async def save(self, newer: OwnerClaim) -> int:
        """Save every segment's unflushed acknowledged bytes; how many were saved."""
        saved_before = self.saved_bytes
        try:
            await self._journal.sync()  # appends in flight are acknowledged: keep them too
        except (OSError, TierFSError) as e:
            log.error("fenced: journal sync failed, saving what is durable: %s", e)
        with trio.move_on_after(FLUSH_WAIT_S):
            while any(seg.flushing for seg in self._table.in_memory()):
                await trio.sleep(0.01)
        for seg in self._table.in_memory():  # every segment with unflushed bytes is
            if seg.appended_length > seg.flushed_length and not seg.deleted:
                try:
                    await self._save_segment(seg, newer)
                except (OSError, TierFSError) as e:
                    log.error("fenced: could not save %r to lost+found (its bytes stay in the "
                              "journal): %s", seg.name, e)
        return self.saved_bytes - saved_before

    async def _save_segment(self, seg: SegmentState, newer: OwnerClaim) -> None:
        start, end = seg.flushed_length, seg.appended_length
        path = entry_path(self._data_dir, seg.name, self._epoch)
        whole = 0
        position = start
        while position < end:
            piece_end = min(end, position + PIECE_BYTES)
            data = await self._tail.tail_bytes(seg, position, piece_end)
            whole = crc32c(data, whole)
            await trio.to_thread.run_sync(write_piece, path, position - start, data)
            position = piece_end
        marks = seg.marks
        writers: list[tuple[str, int, int, int]] = [] if marks is None else [
            (f"{writer:016x}", mark.seq, mark.offset, mark.length)
            for writer, mark in marks.all_marks() if start <= mark.offset and mark.end <= end]
        description: dict[str, object] = {
            "segment": seg.name, "segment_id": seg.segment_id, "epoch": self._epoch,
            "start_offset": start, "end_offset": end, "bytes": end - start, "crc32c": whole,
            "why": f"acknowledged by this store (epoch {self._epoch}) after epoch {newer.epoch} took tier-2 over; "
                   "never committed there",
            "writers": [list(w) for w in sorted(writers, key=lambda w: w[2])],
            "fenced_by": dataclasses.asdict(newer),
            "saved_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        await trio.to_thread.run_sync(write_description, path, description)
        self.saved_bytes += end - start
        log.error("fenced: %d acknowledged bytes of %r (offsets %d..%d) saved to %s",
                  end - start, seg.name, start, end, path)
