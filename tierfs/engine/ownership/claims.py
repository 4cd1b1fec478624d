"""Owner claims on tier-2: who may write there, decided where the data lives.

A claim is a small JSON object ``_owner/epoch-<epoch>`` beside the chunks (outside the
chunk namespace ``s<id>/...``) holding the epoch, a fresh owner id (a UUID per
opening), host, pid, data dir and time, and where that data dir physically is (the
machine's id, the directory's inode). The current owner of a tier-2 is the claim with
the highest epoch. A store opens only if that claim is the one its data dir made last
(``<data_dir>/owner-claim.json``) *and* this is that data dir, not a copy of it, or
tier-2 holds no claim yet, or the user takes over explicitly; it then claims
``max(local epoch, highest claim) + 1``.

A copy is not an owner: a copy of a data dir (``cp -a``, a restored backup, a VM
snapshot started on another machine) carries the original's ``owner-claim.json``, but
not its place: another inode or machine id. It is refused (``owned_elsewhere``, naming
the original) until the user takes over; the original, if it still runs, is then
fenced. A data dir renamed on its file system keeps its place; one moved to another
disk is a copy: one ``--takeover`` settles it.

Opening survives a kill at any point: the new claim is written to the data dir as
*pending* (``owner-claim.pending.json``) before it is created on tier-2, and promoted
after; a tier-2 claim matching the pending one is this data dir's own.

Invariants:
- A claim is created exclusively, so two owners never hold one epoch: locally a
  complete temporary file is ``link(2)``ed to the claim's name (fails if it exists);
  on S3 a PUT with ``If-None-Match: *`` (moto's server and AWS honour it); on other
  fsspec stores fsspec's ``mode="create"`` (exists-then-write, not atomic: see
  docs/ARCHITECTURE.md, Fencing). Every creation is read back and compared, so a
  store that silently ignored the condition is caught when the other write came first,
  and then attempted once more with the same bytes: a store that accepts that does not
  honour the condition, which is logged as a warning, never trusted silently.
- A claim is never changed; the owner that just claimed deletes claims more than
  ``KEEP_CLAIMS`` epochs below its own, nothing else deletes claims.
- Listing reads only the ``_owner/`` prefix (never the chunks) and never a cached
  listing, so a check costs one LIST and one GET whatever the store holds.
- Methods block; callers run them in worker threads under the tier-2 limiter.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tierfs.contracts.errors import OwnedElsewhereError, Tier2Error
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.tier2.calls import tier2_call
from tierfs.engine.tier2.chunk_storage import ChunkStorage, FsspecChunkStorage, LocalChunkStorage

log = logging.getLogger(__name__)

CLAIM_PREFIX = "_owner/"
LOCAL_CLAIM_FILE = "owner-claim.json"
PENDING_CLAIM_FILE = "owner-claim.pending.json"
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
KEEP_CLAIMS = 16  # older claims are pruned: a check lists a handful of names, not one per opening
MAX_CLAIM_BYTES = 64 << 10  # a claim is ~300 bytes; anything larger is not ours


def machine_id() -> str:
    """This machine's id (systemd's ``/etc/machine-id``), or "" where there is none."""
    for path in MACHINE_ID_FILES:
        try:
            return Path(path).read_text().strip()
        except OSError:
            continue
    return ""


def data_dir_place(data_dir: Path) -> str:
    """Where ``data_dir`` physically is: the machine's id and the directory's inode. A
    copy, wherever it is, has another one; a data dir renamed (``mv`` on one file
    system) keeps its own. The device number is left out: it can change across reboots."""
    try:
        inode = os.stat(data_dir).st_ino
    except FileNotFoundError:
        inode = 0
    return f"{machine_id()}:{inode}"


@dataclasses.dataclass(frozen=True)
class OwnerClaim:
    epoch: int
    owner_id: str
    host: str
    pid: int
    data_dir: str
    claimed_at: str  # ISO 8601, UTC
    place: str = ""  # ``data_dir_place`` of the claiming data dir ("": a claim made before it was kept)

    @classmethod
    def new(cls, epoch: int, data_dir: Path) -> OwnerClaim:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(epoch, str(uuid.uuid4()), socket.gethostname(), os.getpid(), str(data_dir.absolute()), now,
                   data_dir_place(data_dir))

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> OwnerClaim:
        values: dict[str, Any] = json.loads(raw)
        return cls(int(values["epoch"]), str(values["owner_id"]), str(values["host"]),
                   int(values["pid"]), str(values["data_dir"]), str(values["claimed_at"]),
                   str(values.get("place", "")))

    def same_owner(self, other: OwnerClaim | None) -> bool:
        return other is not None and (self.epoch, self.owner_id) == (other.epoch, other.owner_id)

    def made_here(self, data_dir: Path) -> bool:
        """The claim was made by ``data_dir`` itself, not by the original of a copy."""
        return not self.place or self.place == data_dir_place(data_dir)

    def describe(self) -> str:
        return f"host {self.host} pid {self.pid} data dir {self.data_dir}, claimed {self.claimed_at}"


def claim_name(epoch: int) -> str:
    return f"{CLAIM_PREFIX}epoch-{epoch:06d}"


def _epoch_of(name: str) -> int | None:
    base = name.rsplit("/", 1)[-1]
    if base.startswith("epoch-") and base[6:].isdigit():
        return int(base[6:])
    return None


def unreadable_claim(epoch: int) -> OwnerClaim:
    """Stands for a claim object that exists but cannot be parsed (not ours, surely)."""
    return OwnerClaim(epoch, "unreadable", "?", 0, "?", "?")


class OwnerClaims:
    """The claims under ``_owner/`` of one tier-2 (local directory or fsspec store)."""

    def __init__(self, storage: ChunkStorage) -> None:
        self.url = storage.url
        self._storage = storage

    # ------------------------------------------------------------ raw object access
    def _epochs(self) -> list[int]:
        storage = self._storage
        if isinstance(storage, LocalChunkStorage):
            def names() -> list[str]:
                try:
                    return os.listdir(storage.root / CLAIM_PREFIX)
                except FileNotFoundError:
                    return []
        elif isinstance(storage, FsspecChunkStorage):
            def names() -> list[str]:
                try:
                    found = storage.fs.ls(f"{storage.root}/{CLAIM_PREFIX}", detail=False, refresh=True)
                except FileNotFoundError:
                    return []
                return [str(p) for p in found]
        else:
            raise Tier2Error(f"tier-2 {self.url} ({type(storage).__name__}) cannot hold owner claims")
        found = tier2_call(CLAIM_PREFIX, names, label=storage.label)
        return sorted(e for e in (_epoch_of(n) for n in found) if e is not None)

    def read(self, epoch: int) -> OwnerClaim:
        raw = self._storage.read(claim_name(epoch), 0, MAX_CLAIM_BYTES)
        try:
            return OwnerClaim.from_json(raw)
        except (ValueError, KeyError, TypeError):
            return unreadable_claim(epoch)

    def _create_exclusive(self, name: str, data: bytes) -> None:
        """Create ``name`` holding ``data`` unless it exists (``FileExistsError``)."""
        storage = self._storage
        if isinstance(storage, LocalChunkStorage):
            path = storage.root / name
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, path)  # atomic; EEXIST if another owner got there first
            finally:
                os.unlink(temporary)
            fsync_directory(path.parent)
        else:
            assert isinstance(storage, FsspecChunkStorage)
            # s3fs: PUT with If-None-Match: * ; a server that refuses answers 412
            storage.fs.pipe_file(f"{storage.root}/{name}", data, mode="create")

    # ------------------------------------------------------------ what callers use
    def current(self) -> OwnerClaim | None:
        """The claim with the highest epoch, or None if tier-2 holds none."""
        epochs = self._epochs()
        return self.read(epochs[-1]) if epochs else None

    def create(self, claim: OwnerClaim) -> None:
        """Claim ``claim.epoch`` exclusively; ``OwnedElsewhereError`` naming the winner
        if another owner holds that epoch (the claim is read back either way)."""
        name = claim_name(claim.epoch)
        try:
            self._create_exclusive(name, claim.to_json())
        except FileExistsError:
            pass  # read back below: the winner is named in the error
        except OSError as e:
            # a refused condition may come back as another error (412 as EINVAL); an
            # interrupted PUT may have landed: the read-back decides
            if not self._exists(claim.epoch):
                raise Tier2Error(f"cannot create owner claim {name} on {self.url}: {e}") from e
        stored = self.read(claim.epoch)
        if not claim.same_owner(stored):
            raise owned_elsewhere(self.url, stored, " (it claimed the same epoch first)")
        self._check_exclusive_create(name, claim.to_json())

    def _check_exclusive_create(self, name: str, data: bytes) -> None:
        """Create the claim again, with the same bytes: a store that honours exclusive
        creation refuses; one that does not (s3rver, some S3-compatible servers) just
        rewrites the same bytes, and is named in the log instead of trusted silently."""
        try:
            self._create_exclusive(name, data)
        except OSError:  # FileExistsError, or a refused condition as another OSError
            return
        log.warning(
            "tier-2 %s does not honour exclusive creation (If-None-Match: *): two owners "
            "claiming one epoch at the same moment could both start; the loser is fenced at "
            "its next claim check (docs/ARCHITECTURE.md, Fencing)", self.url,
        )

    def _exists(self, epoch: int) -> bool:
        return epoch in self._epochs()

    def prune(self, below_epoch: int) -> None:
        """Delete claims more than ``KEEP_CLAIMS`` below ``below_epoch``."""
        for epoch in self._epochs():
            if epoch < below_epoch - KEEP_CLAIMS:
                self._storage.delete(claim_name(epoch))


def owned_elsewhere(url: str, claim: OwnerClaim, reason: str = "") -> OwnedElsewhereError:
    return OwnedElsewhereError(url, claim.epoch, claim.owner_id, claim.host, claim.pid,
                               claim.data_dir, claim.claimed_at, reason)


# ---------------------------------------------------------------- the data dir's side
def _read_claim_file(path: Path) -> OwnerClaim | None:
    try:
        return OwnerClaim.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # damaged: the data dir cannot prove a claim; takeover decides


def read_local_claim(data_dir: Path) -> OwnerClaim | None:
    """The claim this data dir made last, or None."""
    return _read_claim_file(data_dir / LOCAL_CLAIM_FILE)


def _write_claim_file(path: Path, claim: OwnerClaim) -> None:
    """Write ``path`` atomically (temporary file, fsync, rename, directory fsync)."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, claim.to_json())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def write_local_claim(data_dir: Path, claim: OwnerClaim) -> None:
    """Record ``claim`` as the one this data dir made last, and drop the pending one."""
    _write_claim_file(data_dir / LOCAL_CLAIM_FILE, claim)
    (data_dir / PENDING_CLAIM_FILE).unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class Ownership:
    """What ``take_ownership`` did: the new claim, and whether this data dir's metadata
    continues the previous owner's (it was this data dir), or the previous owner was
    another data dir, which may hold commits this metadata never saw."""

    claim: OwnerClaim
    continued: bool


def take_ownership(data_dir: Path, claims: OwnerClaims, local_epoch: int, takeover: bool,
                   before_claim: Callable[[], None] | None = None) -> Ownership:
    """Claim tier-2 for this data dir (blocking); ``before_claim`` (cluster mode: the
    lease's check) runs just before the claim is made and refuses it by raising.

    Refused with ``OwnedElsewhereError`` when tier-2's newest claim is not the one this
    data dir made last (or meant to make when a kill stopped it), or was made by the
    original of this copy, unless ``takeover``; the new epoch exceeds both the local
    epoch and every claim, so chunk names stay unique across owners."""
    current = claims.current()
    mine = read_local_claim(data_dir)
    pending = _read_claim_file(data_dir / PENDING_CLAIM_FILE)
    ours = current is not None and any(current.same_owner(c) for c in (mine, pending))
    continued = current is None or (ours and current.made_here(data_dir))
    if not continued and not takeover:
        assert current is not None
        if ours:
            reason = (f"; this data dir is a copy of the one that claimed it ({current.data_dir}, "
                      f"{current.place or 'elsewhere'}), not that data dir")
        elif mine is None:
            reason = " and this data dir has never claimed it"
        else:
            reason = f"; this data dir last claimed epoch {mine.epoch}"
        raise owned_elsewhere(claims.url, current, reason)
    epoch = max(local_epoch, current.epoch if current is not None else 0) + 1
    claim = OwnerClaim.new(epoch, data_dir)
    if before_claim is not None:
        before_claim()
    _write_claim_file(data_dir / PENDING_CLAIM_FILE, claim)  # a kill from here on: still ours
    claims.create(claim)
    write_local_claim(data_dir, claim)
    claims.prune(epoch)
    return Ownership(claim, continued)
