"""Every error tierfs raises on purpose.

Invariants:
- Each error carries the facts a user needs to act (``BadOffsetError(expected, actual)``)
  and a stable ``code`` string that front ends translate to an errno or HTTP status in
  exactly one place each.
- Errors that mean "the thing is not there / already there / bad argument" also derive
  from the matching builtin (``FileNotFoundError``, ``FileExistsError``, ``ValueError``)
  so generic Python code (fsspec, pandas) handles them naturally.
- Raising any of these before a state change guarantees that nothing changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tierfs.contracts.size_text import readable_size


class TierFSError(Exception):
    """Base class of every error raised deliberately by tierfs."""

    code = "internal"

    def __str__(self) -> str:
        # OSError subclasses would otherwise print "[Errno None] None: ...".
        return str(self.args[0]) if self.args else self.__class__.__name__


class InvalidNameError(TierFSError, ValueError):
    """A segment or directory name was rejected; nothing was changed."""

    code = "invalid_name"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class NameTooLongError(InvalidNameError):
    """A name component is over 255 bytes, or the whole name over the store's limit
    (ENAMETOOLONG on the mount); nothing was changed."""

    code = "name_too_long"


class UnauthorizedError(TierFSError, PermissionError):
    """A daemon refused the request: its bearer token was missing or wrong."""

    code = "unauthorized"


class InvalidArgumentError(TierFSError, ValueError):
    """An argument other than a name was out of range; nothing was changed."""

    code = "invalid_argument"


class InvalidRangeError(InvalidArgumentError):
    """A read range that is malformed or ends before it starts (``bytes=5-2``); nothing
    was read. A well-formed range that starts past the end is ``OffsetOutOfRangeError``."""

    code = "invalid_range"

    def __init__(self, header: str, length: int, reason: str) -> None:
        super().__init__(f"invalid Range {header!r}: {reason}")
        self.length = length


class AppendTooLargeError(InvalidArgumentError):
    """One append larger than ``max_append_bytes``; nothing was written."""

    code = "too_large"

    def __init__(self, size: int, limit_bytes: int) -> None:
        super().__init__(f"append of {readable_size(size)} ({size} bytes) exceeds max_append_bytes "
                         f"({readable_size(limit_bytes)}): split it into smaller records")
        self.length = size
        self.limit_bytes = limit_bytes


class SegmentNotFoundError(TierFSError, FileNotFoundError):
    """No segment or directory exists under this name."""

    code = "not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"no such segment or directory: {name!r}")
        self.name = name
        self.filename = name


class SegmentExistsError(TierFSError, FileExistsError):
    """A segment or directory already exists under this name."""

    code = "exists"

    def __init__(self, name: str) -> None:
        super().__init__(f"already exists: {name!r}")
        self.name = name
        self.filename = name


class NotADirectoryError_(TierFSError, NotADirectoryError):
    """A path component that must be a directory is a segment (or is missing)."""

    code = "not_a_directory"

    def __init__(self, name: str) -> None:
        super().__init__(f"not a directory: {name!r}")
        self.name = name


class IsADirectoryError_(TierFSError, IsADirectoryError):
    """A segment operation was asked of a directory."""

    code = "is_a_directory"

    def __init__(self, name: str) -> None:
        super().__init__(f"is a directory, not a segment: {name!r}")
        self.name = name


class DirectoryNotEmptyError(TierFSError, OSError):
    """rmdir of a directory that still holds entries."""

    code = "not_empty"

    def __init__(self, name: str) -> None:
        super().__init__(f"directory not empty: {name!r}")
        self.name = name


class BadOffsetError(TierFSError):
    """A conditional append's expected offset did not match; nothing was written."""

    code = "bad_offset"

    def __init__(self, name: str, expected: int, actual: int) -> None:
        super().__init__(
            f"conditional append to {name!r} expected offset {expected} "
            f"but the segment length is {actual}; nothing was written"
        )
        self.name = name
        self.expected = expected
        self.actual = actual


class SegmentSealedError(TierFSError, PermissionError):
    """An append (or other change) was refused because the segment is sealed."""

    code = "sealed"

    def __init__(self, name: str) -> None:
        super().__init__(f"segment is sealed: {name!r}")
        self.name = name


class RewriteRefusedError(TierFSError, PermissionError):
    """A whole-file rewrite (a new empty segment under a name) was refused: append-only
    unless the directory's policy has ``rewrite_replaces=1``."""

    code = "append_only"

    def __init__(self, name: str) -> None:
        directory = name.rpartition("/")[0] or "/"
        super().__init__(f"{name!r} is append-only: to let rewrites replace files in {directory}, "
                         f"run: tierfs policy set {directory} rewrite_replaces=1")
        self.name = name


class OffsetOutOfRangeError(TierFSError, ValueError):
    """A read started past the readable end of the segment."""

    code = "out_of_range"

    def __init__(self, name: str, offset: int, length: int) -> None:
        super().__init__(f"offset {offset} is past the end ({length}) of {name!r}")
        self.name = name
        self.offset = offset
        self.length = length


class TruncatedError(OffsetOutOfRangeError):
    """A read asked for bytes that retention deleted from the segment's head."""

    code = "truncated"

    def __init__(self, name: str, offset: int, start_offset: int) -> None:
        TierFSError.__init__(
            self,
            f"bytes of {name!r} below offset {start_offset} were deleted by retention; "
            f"offset {offset} cannot be read (read from {start_offset} on)",
        )
        self.name = name
        self.offset = offset
        self.length = start_offset


class OffloadRunningError(TierFSError):
    """An offload of this segment is already running; nothing new was started."""

    code = "already_running"

    def __init__(self, name: str) -> None:
        super().__init__(f"an offload of {name!r} is already running")
        self.name = name


class AlreadyCommittedError(TierFSError):
    """A concat carried a writer transaction number the target has already committed
    (a replayed Spark batch, a retried commit); nothing was changed."""

    code = "already_committed"

    def __init__(self, name: str, writer: str, writer_seq: int, committed_seq: int) -> None:
        super().__init__(
            f"{name!r} already holds transaction {committed_seq} of writer {writer!r}; "
            f"{writer_seq} is not newer"
        )
        self.name = name


class AlreadyAppendedError(TierFSError):
    """An append sent again with a writer sequence number older than that writer's last
    append to the segment: it landed earlier (a writer's appends land in order), where
    is no longer known; nothing was changed."""

    code = "already_appended"

    def __init__(self, name: str, writer: str, writer_seq: int, last_seq: int) -> None:
        super().__init__(f"{name!r}: append {writer_seq} of writer {writer} landed before its "
                         f"append {last_seq}; not appended again")
        self.name = name
        self.writer_seq = writer_seq


class DataCorruptionError(TierFSError, OSError):
    """Stored bytes failed their CRC32C check; no data was returned."""

    code = "corrupt"


class BacklogFullError(TierFSError, OSError):
    """Appends refused: the unflushed backlog reached its configured bound.

    Raised while tier-2 cannot keep up (or is failing); nothing was written. Retry once
    the storage writer has caught up.
    """

    code = "backlog_full"

    def __init__(self, backlog_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"append refused: {backlog_bytes} bytes wait to be flushed to tier-2, "
            f"the limit is {limit_bytes} (max_backlog_bytes); retry later"
        )
        self.backlog_bytes = backlog_bytes
        self.limit_bytes = limit_bytes


class NoSpaceError(TierFSError, OSError):
    """The disk holding the data dir (journal, metadata) is full; nothing was written.

    Appends resume by themselves once ``needed_bytes`` are free on that disk (delete
    files there, or let the storage writer flush the journal to tier-2)."""

    code = "no_space"

    def __init__(self, directory: str, needed_bytes: int) -> None:
        super().__init__(
            f"no space left on the journal disk ({directory}): {needed_bytes} more bytes "
            "needed; free space on that disk and retry"
        )
        self.name = directory
        self.length = needed_bytes


class StoreInUseError(TierFSError):
    """Another process owns the data directory."""

    code = "in_use"

    def __init__(self, data_dir: str, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"data directory {data_dir} is in use by {who}")
        self.data_dir = data_dir
        self.pid = pid


class OwnedElsewhereError(TierFSError):
    """Tier-2 is claimed by another owner (a newer epoch, or the same epoch by another
    owner identity): this data dir must not write there. Raised when a store opens;
    nothing was changed. ``tierfs takeover`` (or ``--takeover``) claims it explicitly."""

    code = "owned_elsewhere"

    def __init__(self, tier2_url: str, epoch: int, owner_id: str, host: str, pid: int,
                 data_dir: str, claimed_at: str, reason: str = "") -> None:
        super().__init__(
            f"tier-2 {tier2_url} is owned by epoch {epoch}: host {host} pid {pid} data dir "
            f"{data_dir} (owner {owner_id}, claimed {claimed_at}){reason}; this data dir "
            f"must not write there. If that owner is gone for good, run `tierfs takeover` "
            f"(or pass --takeover)"
        )
        self.tier2_url, self.epoch, self.owner_id = tier2_url, epoch, owner_id
        self.host, self.pid, self.data_dir, self.claimed_at = host, pid, data_dir, claimed_at


class StoreClosedError(TierFSError):
    """The store was closed by its owner; no further operations are accepted."""

    code = "closed"


class Tier2Error(TierFSError, OSError):
    """Tier-2 (chunk store or long-term store) failed or refused a request."""

    code = "tier2"


class ChunkMissingError(Tier2Error):
    """A chunk object named by the metadata is missing from tier-2."""

    code = "chunk_missing"


class FencedError(Tier2Error):
    """This store was fenced: another owner claimed its tier-2 with a newer epoch.

    Appends are refused and nothing more is written to or deleted from tier-2; what
    this store acknowledged but never committed to tier-2 is kept in its journal and
    saved under ``<data dir>/lost+found`` (see docs/ARCHITECTURE.md, Fencing)."""

    code = "fenced"

    def __init__(self, own_epoch: int, new_epoch: int, new_owner: str) -> None:
        super().__init__(
            f"fenced: this store (epoch {own_epoch}) lost tier-2 to epoch {new_epoch} "
            f"({new_owner}); appends are refused, unflushed bytes go to lost+found"
        )
        self.epoch, self.new_epoch, self.new_owner = own_epoch, new_epoch, new_owner


class NoMetadataBackupError(TierFSError):
    """``restore``: tier-2 holds no complete, intact metadata backup under ``_metadata/``."""

    code = "no_backup"


class MetadataFormatError(TierFSError, ValueError):
    """``metadata import``: the input is not a tierfs metadata export this tierfs reads
    (wrong header, unknown version, a bad or truncated record); nothing was changed."""

    code = "bad_metadata"


class StoreNotEmptyError(TierFSError):
    """``metadata import`` / ``restore``: the target store already holds segments or
    directories; nothing was changed."""

    code = "store_not_empty"


class ConcurrentModificationError(TierFSError):
    """A conditional metadata update found the record changed underneath it."""

    code = "conflict"


class JournalCorruptionError(TierFSError):
    """The journal holds damage recovery cannot cut off as a torn tail."""

    code = "journal_corrupt"


class MetadataDamagedError(TierFSError):
    """The data dir's own metadata (``metadata.sqlite``) is damaged or missing while its
    journal or claim shows it held a store: nothing was opened or changed."""

    code = "metadata_damaged"

    def __init__(self, path: str, reason: str, data_dir: str, tier2_url: str) -> None:
        super().__init__(
            f"{path} is {reason}; rebuild it from tier-2's backups with `tierfs restore --data-dir {data_dir} "
            f"--tier2 {tier2_url}` (the journal stays and is replayed: no acknowledged append it holds is lost)")
        self.name = path


class MetadataUnavailableError(TierFSError, ConnectionError):
    """The metadata database (PostgreSQL) cannot be reached, or the connection broke;
    the operation did not happen (retry it once the database answers)."""

    code = "metadata_unavailable"

    def __init__(self, database: str, reason: str) -> None:
        super().__init__(f"metadata database {database} is unavailable: {reason}")
        self.database = database
        self.reason = reason


class MetadataVersionError(TierFSError):
    """The metadata database was written by a newer tierfs (a schema version this one
    does not know); nothing was changed. Upgrade tierfs on this host."""

    code = "metadata_version"

    def __init__(self, database: str, found_version: int, known_version: int) -> None:
        super().__init__(
            f"metadata database {database} is at schema version {found_version}, newer than "
            f"this tierfs knows ({known_version}); upgrade tierfs on this host"
        )
        self.database = database


class WrongTier2Error(TierFSError):
    """The metadata database describes chunks in another tier-2 than the one this store
    was given: opening it would mix two stores' objects. Nothing was changed."""

    code = "wrong_tier2"

    def __init__(self, database: str, recorded_tier2: str, given_tier2: str) -> None:
        super().__init__(
            f"metadata database {database} belongs to tier-2 {recorded_tier2}, not {given_tier2}; "
            "give that tier-2 (--tier2), or another database (--metadata)"
        )
        self.database = database


class DaemonUnavailableError(TierFSError, ConnectionError):
    """No daemon answers at the address tried."""

    code = "unavailable"


class DaemonOverloadedError(DaemonUnavailableError):
    """A daemon is running but did not accept a connection (its accept queue stayed
    full, or it refused while its process lives) for as long as the client retried:
    nothing was sent. Never sent over the wire."""

    code = "daemon_overloaded"


class ResponseLostError(DaemonUnavailableError):
    """A request reached the daemon (or may have) but no answer came back: it may or
    may not have taken effect. Never sent over the wire; appends resolve it
    (``remote.exactly_once``)."""

    code = "response_lost"
    offset: int | None = None  # where a lost append may have landed, when known


class ChunkUnavailable(OSError):
    """A chunk object cannot be read directly (the daemon can still serve its bytes)."""


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


@contextlib.contextmanager
def single_error() -> Iterator[None]:
    """Re-raise the first error of an exception group from parallel tasks unwrapped,
    so callers of tierfs see ``DataCorruptionError``, not a trio nursery's group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        for leaf in leaves:
            if isinstance(leaf, Exception):
                raise leaf from None
        raise leaves[0] from None
