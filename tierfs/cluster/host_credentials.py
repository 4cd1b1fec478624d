"""Per-host credentials between cluster daemons.

A daemon calling another (a forwarded append, call or tail; ``tierfs cluster status``
reading metrics) sends its own token, the one in its data dir, and names itself in
``HOST_HEADER``. The database keeps only each registered daemon's token digest
(SHA-256, ``token_digest``): whoever reads the database, or a backup of it, holds
nothing a daemon accepts.

Invariants:
- A peer's request is taken only if its daemon id is registered (a row in
  ``cluster_daemons``: a daemon that left, or never joined, is refused) and the SHA-256
  of the token it sent equals that row's digest, compared in constant time.
- The digests are re-read at most ``CACHE_S`` after the last read, and at once (at most
  every ``MISS_REREAD_S``) when an unknown id or a wrong token comes: a daemon that just
  joined is taken at once, one that left is refused within ``CACHE_S``. While the
  database does not answer, the digests last read stay in use (the leases they were
  read beside lapse meanwhile anyway); with none read yet, the request fails as
  ``metadata_unavailable``, never as a refusal.
- A token is never logged, printed or stored outside its own data dir.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable

import trio

from tierfs.contracts.errors import TierFSError
from tierfs.contracts.operations import HOST_HEADER

CACHE_S = 2.0
MISS_REREAD_S = 0.2


def token_digest(token: str | bytes) -> str:
    """What the registry keeps of a daemon's token (hex SHA-256)."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).hexdigest()


@dataclasses.dataclass(frozen=True)
class HostCredential:
    """A daemon's proof of who it is to the others."""

    daemon_id: str
    token: str

    def __repr__(self) -> str:  # never the token
        return f"HostCredential({self.daemon_id})"

    def header_lines(self) -> str:
        """The request head lines that carry it (``\\r\\n``-terminated)."""
        return f"authorization: Bearer {self.token}\r\n{HOST_HEADER}: {self.daemon_id}\r\n"


class PeerRegistry:
    """Checks a peer's credentials against the registered digests (see the module
    docstring). ``read_digests`` returns every registered daemon id -> digest."""

    def __init__(self, read_digests: Callable[[], Awaitable[dict[str, str]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read_digests = read_digests
        self._clock = clock
        self._digests: dict[str, str] = {}
        self._read_at_s = -float("inf")
        self._reading = trio.Lock()

    async def verify(self, daemon_id: str, token: bytes) -> bool:
        """True if ``daemon_id`` is registered and ``token`` is its token."""
        now_s = self._clock()
        if now_s - self._read_at_s > CACHE_S:
            await self._reread(now_s)
        elif not self._matches(daemon_id, token) and now_s - self._read_at_s > MISS_REREAD_S:
            await self._reread(now_s)
        return self._matches(daemon_id, token)

    async def _reread(self, wanted_s: float) -> None:
        """Read the digests, unless a read that ended after ``wanted_s`` did (many
        requests at once share one read)."""
        async with self._reading:
            if self._read_at_s >= wanted_s:
                return
            try:
                self._digests = await self._read_digests()
            except TierFSError:
                if not self._digests:
                    raise  # nothing known yet: the caller answers that the database is down
                # the database is down: the peers known a moment ago stay known until it answers
            self._read_at_s = self._clock()

    def _matches(self, daemon_id: str, token: bytes) -> bool:
        expected = self._digests.get(daemon_id)
        given = token_digest(token)
        return expected is not None and hmac.compare_digest(given, expected)
