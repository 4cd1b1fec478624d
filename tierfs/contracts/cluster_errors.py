"""The errors of cluster mode (segment containers owned through leases).

Each has a stable ``code``; the HTTP status and errno tables map them like every
other error (``server/statuses.py``, ``fuse/errors.py``).
"""

from __future__ import annotations

from tierfs.contracts.errors import TierFSError


class CrossContainerError(TierFSError, OSError):
    """A rename or concat between names in different segment containers: each container
    is one owner's store, so such a change cannot be one metadata transaction. Like
    rename(2) across file systems (EXDEV), ``mv`` copies instead."""

    code = "cross_container"

    def __init__(self, operation: str, first: str, second: str) -> None:
        super().__init__(
            f"cannot {operation} {first!r} and {second!r}: their top-level entries are in different "
            "segment containers (copy the bytes instead; keep names that are renamed into each "
            "other under one top-level directory)"
        )
        self.operation, self.first, self.second = operation, first, second


class ContainerUnavailableError(TierFSError, ConnectionError):
    """No daemon serves the segment container of a name, within the wait allowed (the
    owner died and its lease has not yet expired, or no daemon is left)."""

    code = "container_unavailable"

    def __init__(self, name: str, container: int, waited_s: float) -> None:
        super().__init__(
            f"no daemon serves container c{container:03d} of {name!r} (waited {waited_s:.1f} s "
            "for its owner or a new one after its lease expires); retry later"
        )
        self.name, self.container, self.waited_s = name, container, waited_s


class NotOwnerError(TierFSError, ConnectionError):
    """A forwarded request reached a daemon that no longer owns the container (the
    sender's view of the owners was stale); the sender looks the owner up again."""

    code = "not_owner"

    def __init__(self, name: str, container: int) -> None:
        super().__init__(f"this daemon does not own container c{container:03d} of {name!r}")
        self.name, self.container = name, container


class LeaseLapsedError(NotOwnerError):
    """The container's lease lapsed on this daemon before an append could be
    acknowledged (the database stopped answering its renewals, or the daemon was
    paused): another daemon may own the container now. The append may have been kept
    here; sent again with the same writer identity it lands once, wherever the owner is."""

    code = "lease_lapsed"

    def __init__(self, name: str, container: int, late_s: float) -> None:
        TierFSError.__init__(
            self, f"not acknowledged: the lease on container c{container:03d} of {name!r} lapsed "
                  f"{late_s:.1f} s ago (no renewal reached the database in time); send it again")
        self.name, self.container = name, container


class LeaseLapsedWhileOpeningError(LeaseLapsedError):
    """The container's lease lapsed while this daemon opened the container (it was
    paused, its journal replay was slow, the database stopped answering): it does not
    claim tier-2, so a daemon that took the container meanwhile is not fenced by one
    whose lease is gone (what that owner acknowledged would end in its lost+found)."""

    def __init__(self, container: int, late_s: float) -> None:
        TierFSError.__init__(
            self, f"container c{container:03d}: its lease lapsed {late_s:.1f} s ago while it was being opened; "
                  "tier-2 was not claimed (another daemon may own it now)")
        self.name, self.container = "", container
