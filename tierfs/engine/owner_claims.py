"""Owner claims on tier-2: who may write there, decided where the data lives.

A claim is a small JSON object ``_owner/epoch-<epoch>`` beside the chunks (outside the
chunk namespace ``s<id>/...``) holding the epoch, a fresh owner id (a UUID per
opening), host, pid, data dir and time. The current owner of a tier-2 is the claim
with the highest epoch. A store opens only if that claim is the one its data dir made
last (``<data_dir>/owner-claim.json``), or tier-2 holds no claim yet, or the user takes
over explicitly; it then claims ``max(local epoch, highest claim) + 1``.

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
from pathlib import Path
from typing import Any

from tierfs.contracts.errors import OwnedElsewhereError, Tier2Error
from tierfs.engine.chunkstore import ChunkStorage, FsspecChunkStorage, LocalChunkStorage
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.tier2_calls import tier2_call

log = logging.getLogger(__name__)

CLAIM_PREFIX = "_owner/"
LOCAL_CLAIM_FILE = "owner-claim.json"
KEEP_CLAIMS = 16  # older claims are pruned: a check lists a handful of names, not one per opening
MAX_CLAIM_BYTES = 64 << 10  # a claim is ~300 bytes; anything larger is not ours


@dataclasses.dataclass(frozen=True)
class OwnerClaim:
    epoch: int
    owner_id: str
    host: str
    pid: int
    data_dir: str
    claimed_at: str  # ISO 8601, UTC

    @classmethod
    def new(cls, epoch: int, data_dir: Path) -> OwnerClaim:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(epoch, str(uuid.uuid4()), socket.gethostname(), os.getpid(), str(data_dir.absolute()), now)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> OwnerClaim:
        values: dict[str, Any] = json.loads(raw)
        return cls(int(values["epoch"]), str(values["owner_id"]), str(values["host"]),
                   int(values["pid"]), str(values["data_dir"]), str(values["claimed_at"]))

    def same_owner(self, other: OwnerClaim | None) -> bool:
        return other is not None and (self.epoch, self.owner_id) == (other.epoch, other.owner_id)

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
            path.parent.mkdir(parents=True, exist_ok=True)
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
def read_local_claim(data_dir: Path) -> OwnerClaim | None:
    """The claim this data dir made last, or None."""
    try:
        return OwnerClaim.from_json((data_dir / LOCAL_CLAIM_FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # damaged: the data dir cannot prove a claim; takeover decides


def write_local_claim(data_dir: Path, claim: OwnerClaim) -> None:
    """Record ``claim`` in the data dir atomically (temporary file, fsync, rename)."""
    path = data_dir / LOCAL_CLAIM_FILE
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        f.write(claim.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_directory(data_dir)


def take_ownership(data_dir: Path, claims: OwnerClaims, local_epoch: int, takeover: bool) -> OwnerClaim:
    """Claim tier-2 for this data dir (blocking); the new claim.

    Refused with ``OwnedElsewhereError`` when tier-2's newest claim is not the one this
    data dir made last, unless ``takeover``; the new epoch exceeds both the local epoch
    and every claim, so chunk names stay unique across owners."""
    current = claims.current()
    mine = read_local_claim(data_dir)
    if current is not None and not takeover and not current.same_owner(mine):
        if mine is None:
            reason = " and this data dir has never claimed it"
        else:
            reason = f"; this data dir last claimed epoch {mine.epoch}"
        raise owned_elsewhere(claims.url, current, reason)
    epoch = max(local_epoch, current.epoch if current is not None else 0) + 1
    claim = OwnerClaim.new(epoch, data_dir)
    claims.create(claim)
    write_local_claim(data_dir, claim)
    claims.prune(epoch)
    return claim
