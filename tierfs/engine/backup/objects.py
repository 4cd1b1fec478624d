"""The metadata backups' objects on tier-2, under the reserved prefix ``_metadata/``.

One backup is two objects named by the owner's epoch and a sequence number:
``_metadata/e<epoch>-b<seq>.sqlite`` (a SQLite snapshot of ``metadata.sqlite``) and,
written only after the snapshot is complete, ``_metadata/e<epoch>-b<seq>.json`` (its
manifest: format, version, size and CRC32C of the snapshot, the store's epoch, when it
was taken, the last change-log sequence number it holds). Zero-padded numbers make the
newest backup the last name in order. Between snapshots, the changes since are shipped
as ``_metadata/e<epoch>-l<first seq>-<last seq>.log`` (``metadata.change_log``). Before its
first backup object, each owner epoch writes ``_metadata/e<epoch>.lineage``: the epoch
whose metadata it continues and the last change that metadata held when it took over.

Invariants:
- Every object gets a new name and is never overwritten, so a crash or a failed upload
  can leave an incomplete newest backup but never damage an older one; a reader takes
  the newest manifest whose snapshot matches its size and CRC32C. On a local tier-2 an
  object appears under its name only whole (written aside, synced, renamed: a kill
  mid-upload once left an empty change batch that stopped a restore); an object
  store's PUT is whole by itself.
- ``_metadata/`` is outside the chunk namespace (``s<id>/...``) and the owner claims
  (``_owner/``): nothing here is ever taken for a chunk, and no chunk name is ever here.
- Snapshots are streamed between a local file and tier-2 (``put_file``/``get_file``):
  memory does not grow with the size of the metadata.
- Backups of two data dirs can share tier-2 (a copy took over, then the original took
  it back): a restore follows one lineage, from the newest epoch back through its
  parents, each parent only up to where its child took over (``Lineage``), so no
  sibling's snapshot or changes (which name objects that lineage may delete) are mixed in.
- Methods block; the caller runs them in a worker thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierfs.blocks.checksums import crc32c
from tierfs.blocks.filesystems import open_filesystem
from tierfs.contracts.errors import Tier2Error

BACKUP_PREFIX = "_metadata"
MANIFEST_FORMAT = "tierfs-metadata-backup"
MANIFEST_VERSION = 1
# backups kept on tier-2: the newest plus two older ones in case the newest is damaged
KEEP_BACKUPS = 3
FILE_PIECE_BYTES = 1 << 20  # snapshots are checksummed in pieces of this size
_BACKUP_NAME = re.compile(r"^e(\d{12})(?:-(?:b(\d{12})\.(?:sqlite|json)|l(\d{12})-(\d{12})\.log)|\.lineage)$")
UNBOUNDED_SEQ = 1 << 62


@dataclasses.dataclass(frozen=True, order=True)
class BackupManifest:
    """What a manifest object says about its snapshot (ordered oldest first)."""

    epoch: int
    seq: int
    size_bytes: int
    crc32c: int
    created_ns: int
    log_seq: int = 0  # the last change-log sequence number the snapshot holds

    @property
    def stem(self) -> str:
        return backup_stem(self.epoch, self.seq)

    def to_json(self) -> bytes:
        body = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
                **dataclasses.asdict(self), "snapshot": f"{self.stem}.sqlite"}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BackupManifest:
        """The manifest in ``data``; ``ValueError`` if it is not one this tierfs reads."""
        body = json.loads(data)
        if body.get("format") != MANIFEST_FORMAT or body.get("version") != MANIFEST_VERSION:
            raise ValueError(f"not a {MANIFEST_FORMAT} version {MANIFEST_VERSION} manifest")
        return cls(**{f.name: int(body[f.name]) for f in dataclasses.fields(cls) if f.name in body or
                      f.default is dataclasses.MISSING})


def backup_stem(epoch: int, seq: int) -> str:
    return f"e{epoch:012d}-b{seq:012d}"


@dataclasses.dataclass(frozen=True)
class LogObject:
    """One shipped batch of changes: sequence numbers ``first``..``last`` by ``epoch``."""

    epoch: int
    first: int
    last: int

    @property
    def name(self) -> str:
        return f"e{self.epoch:012d}-l{self.first:012d}-{self.last:012d}.log"


@dataclasses.dataclass(frozen=True)
class LineageLink:
    """Owner ``epoch`` continued the metadata of epoch ``parent`` (0: a new store) as it
    was after change ``fork_seq``."""

    epoch: int
    parent: int
    fork_seq: int

    @property
    def name(self) -> str:
        return f"e{self.epoch:012d}.lineage"

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LineageLink:
        body = json.loads(data)
        return cls(int(body["epoch"]), int(body["parent"]), int(body["fork_seq"]))


@dataclasses.dataclass(frozen=True)
class Lineage:
    """The backups that describe the newest owner's metadata: of each epoch in
    ``limits``, the changes up to its limit; of every epoch below ``unlinked_below`` (a
    store older than lineage links), those up to ``unlinked_limit``."""

    limits: dict[int, int]
    unlinked_below: int = 0
    unlinked_limit: int = 0

    @classmethod
    def of(cls, links: list[LineageLink]) -> Lineage:
        """From the newest linked epoch back through its parents; without any link (a
        store older than links), every epoch's backups."""
        by_epoch = {link.epoch: link for link in links}
        if not by_epoch:
            return cls({}, unlinked_below=UNBOUNDED_SEQ, unlinked_limit=UNBOUNDED_SEQ)
        epoch = max(by_epoch)
        limits = {epoch: UNBOUNDED_SEQ}
        while (link := by_epoch.get(epoch)) is not None and 0 < link.parent < epoch:
            limits[link.parent] = min(limits.get(link.parent, UNBOUNDED_SEQ), link.fork_seq)
            epoch = link.parent
        if epoch in by_epoch:  # a new store's first epoch: nothing before it
            return cls(limits)
        return cls(limits, unlinked_below=epoch, unlinked_limit=limits[epoch])

    @property
    def head(self) -> int:
        """The newest epoch of the lineage (0: none linked)."""
        return max(self.limits, default=0)

    def holds(self, epoch: int, last_seq: int) -> bool:
        """Whether a backup of ``epoch`` holding changes up to ``last_seq`` is this lineage's."""
        if epoch in self.limits:
            return last_seq <= self.limits[epoch]
        return epoch < self.unlinked_below and last_seq <= self.unlinked_limit


def log_chain(logs: list[LogObject], after_seq: int, from_epoch: int) -> list[LogObject]:
    """The logs a restore applies over a snapshot holding changes up to ``after_seq``,
    taken at ``from_epoch``, in order: those of later or equal epochs. Where an epoch's
    logs overlap an earlier epoch's (the store reopened and shipped again what was not
    pruned, or a zombie shipped after the takeover), the later epoch's win from its
    first sequence number on."""
    chosen: list[LogObject] = []
    for epoch in sorted({log.epoch for log in logs if log.epoch >= from_epoch}):
        mine = sorted((log for log in logs if log.epoch == epoch), key=lambda log: log.first)
        if mine:
            chosen = [log for log in chosen if log.last < mine[0].first] + mine
    return [log for log in chosen if log.last > after_seq]


def file_crc32c(path: Path) -> tuple[int, int]:
    """(size in bytes, CRC32C) of a local file, read in bounded pieces."""
    size_bytes, value = 0, 0
    with open(path, "rb") as f:
        while piece := f.read(FILE_PIECE_BYTES):
            size_bytes += len(piece)
            value = crc32c(piece, value)
    return size_bytes, value


class BackupObjects:
    """The ``_metadata/`` folder of one tier-2 URL (any fsspec URL or a local path)."""

    def __init__(self, tier2_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = tier2_url
        self.fs, root = open_filesystem(tier2_url, storage_options)
        self.folder = f"{root.rstrip('/')}/{BACKUP_PREFIX}"
        protocol = self.fs.protocol
        self._local = "file" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))
        self._links: dict[str, LineageLink] = {}  # read once: a link is never rewritten

    def _path(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def _call(self, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except FileNotFoundError:
            raise
        except Exception as e:  # any backend failure: the caller retries next cycle
            raise Tier2Error(f"metadata backup: {what} on {self.url} failed: {type(e).__name__}: {e}") from e

    def _private(self, *paths: str) -> None:
        """On a local tier-2, owner-only like the chunks (they hold every segment's name)."""
        if self._local:
            for path in paths:
                os.chmod(path, 0o600 if os.path.isfile(path) else 0o700)

    def _folder(self) -> None:
        self._call("mkdir", self.fs.makedirs, self.folder, True)  # a no-op on object stores
        self._private(self.folder)

    def upload(self, snapshot: Path, manifest: BackupManifest) -> None:
        """The snapshot, then its manifest: a manifest never names a missing snapshot."""
        self._folder()
        snapshot_path, manifest_path = self._path(f"{manifest.stem}.sqlite"), self._path(f"{manifest.stem}.json")
        if self._local:
            self._whole(snapshot_path, lambda part: shutil.copyfile(snapshot, part))
        else:
            self._call("upload", self.fs.put_file, str(snapshot), snapshot_path)
        self._put(manifest_path, manifest.to_json())

    def upload_log(self, log: LogObject, data: bytes) -> None:
        self._folder()
        self._put(self._path(log.name), data)

    def upload_lineage(self, link: LineageLink) -> None:
        self._folder()
        self._put(self._path(link.name), link.to_json())

    def _put(self, path: str, data: bytes) -> None:
        if self._local:
            self._whole(path, lambda part: Path(part).write_bytes(data))
        else:  # an object store's PUT shows the whole object or nothing
            self._call("upload", self.fs.pipe_file, path, data)

    def _whole(self, path: str, write: Any) -> None:
        """A local object appears whole under its name or not at all (a kill mid-write
        leaves a ``.part`` file no reader takes for a backup): written aside, synced,
        renamed."""
        part = f"{path}.part"
        try:
            write(part)
            self._private(part)
            with open(part, "rb") as f:
                os.fsync(f.fileno())
            os.replace(part, path)
        except OSError as e:
            raise Tier2Error(f"metadata backup: upload on {self.url} failed: {type(e).__name__}: {e}") from e

    def lineage(self) -> Lineage:
        """The lineage of the newest epoch that wrote a link (unreadable links are skipped)."""
        for name in self.names():
            if name.endswith(".lineage") and name not in self._links:
                try:
                    self._links[name] = LineageLink.from_json(self._call("read", self.fs.cat_file, self._path(name)))
                except (ValueError, KeyError, TypeError, FileNotFoundError):
                    continue
        return Lineage.of(list(self._links.values()))

    def logs(self) -> list[LogObject]:
        return [LogObject(int(m.group(1)), int(m.group(3)), int(m.group(4)))
                for name in self.names() if (m := _BACKUP_NAME.match(name)) and m.group(3)]

    def read_log(self, log: LogObject) -> bytes:
        return bytes(self._call("read", self.fs.cat_file, self._path(log.name)))

    def names(self) -> list[str]:
        """Backup object names (no prefix) in order, oldest first; others are ignored."""
        self.fs.invalidate_cache(self.folder)  # another process may have written since
        try:
            found = self._call("list", self.fs.find, self.folder)
        except FileNotFoundError:
            return []
        names = (str(path).rsplit("/", 1)[-1] for path in found)
        return sorted(name for name in names if _BACKUP_NAME.match(name))

    def manifests(self) -> list[BackupManifest]:
        """Every readable manifest, newest first (unreadable ones are skipped)."""
        found = []
        for name in reversed(self.names()):
            if name.endswith(".json"):
                try:
                    found.append(BackupManifest.from_json(self._call("read", self.fs.cat_file, self._path(name))))
                except (ValueError, KeyError, TypeError, FileNotFoundError):
                    continue
        return found

    def download(self, manifest: BackupManifest, target: Path) -> bool:
        """Fetch the manifest's snapshot into ``target``; False if it is missing or does
        not match the manifest's size and CRC32C (``target`` is then removed)."""
        try:
            self._call("download", self.fs.get_file, self._path(f"{manifest.stem}.sqlite"), str(target))
        except FileNotFoundError:
            return False
        if file_crc32c(target) == (manifest.size_bytes, manifest.crc32c):
            return True
        target.unlink()
        return False

    def prune(self, keep: int = KEEP_BACKUPS) -> list[str]:
        """Delete all but the newest ``keep`` backups of the newest owner's lineage
        (manifest first, then snapshot), every backup older than those (a sibling's
        included), snapshots older than those whose manifest never arrived, and the logs
        the oldest kept snapshot holds already. Returns the names."""
        names = self.names()
        snapshots = [n for n in names if n.endswith((".sqlite", ".json"))]  # links are kept
        lineage = self.lineage()
        ours = [m for m in self.manifests() if lineage.holds(m.epoch, m.log_seq)]  # newest first
        if len(ours) > keep:
            oldest: BackupManifest | None = ours[keep - 1]
            oldest_kept = ours[keep - 1].stem
        else:
            oldest = ours[-1] if ours else None
            stems = sorted(name.rsplit(".", 1)[0] for name in snapshots if name.endswith(".json"))
            oldest_kept = stems[0] if stems else ""
        doomed = [n for n in snapshots if n.rsplit(".", 1)[0] < oldest_kept]
        if oldest is not None and oldest.log_seq:  # logs the oldest kept snapshot holds already
            doomed += [log.name for log in self.logs() if log.last <= oldest.log_seq and log.epoch <= oldest.epoch]
        doomed.sort(key=lambda n: (n.rsplit(".", 1)[0], not n.endswith(".json")))
        for name in doomed:
            self._call("delete", self.fs.rm_file, self._path(name))
        return doomed

    def highest_epoch(self) -> int:
        """The highest epoch named by any backup object (0 if none)."""
        return max((int(m.group(1)) for n in self.names() if (m := _BACKUP_NAME.match(n))), default=0)

    def chunk_names(self) -> list[str]:
        """Every object name outside the reserved ``_`` folders (restore only: it lists
        all of tier-2 once to find the highest epoch that ever wrote a chunk)."""
        root = self.folder.rsplit("/", 1)[0]
        self.fs.invalidate_cache(root)
        try:
            found = self._call("list", self.fs.find, root)
        except FileNotFoundError:
            return []
        names = (str(path)[len(root) + 1:] for path in found)
        return [name for name in names if not name.startswith("_")]
