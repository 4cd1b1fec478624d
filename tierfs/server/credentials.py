"""Who may call the daemon over TCP (the API on ``--listen`` and a cluster daemon's
append listener); the Unix sockets are owner-only files and ask for nothing.

Invariants:
- A request is taken with the daemon's own token (its owner's clients: the file
  ``token`` in the data dir), or, on a cluster daemon, from a registered peer:
  ``HOST_HEADER`` names the peer and the token is the peer's own
  (``cluster.host_credentials``).
- A request that names a host is judged as that peer's only: the daemon's own token
  with a host name is refused, and a one-host daemon refuses every host name.
- Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping

from tierfs.contracts.errors import UnauthorizedError
from tierfs.contracts.operations import HOST_HEADER

# (peer daemon id, the token it sent) -> whether it is a registered peer's
PeerCheck = Callable[[str, bytes], Awaitable[bool]]

UNAUTHORIZED_MESSAGE = ("missing or wrong bearer token: send the daemon's token (the file 'token' in its data "
                        "dir, on its host; the CLI reads TIERFS_TOKEN); another cluster daemon sends its own, "
                        "and must be registered in the cluster")


_HOST_HEADER = HOST_HEADER.lower().encode()


class TcpCredentials:
    def __init__(self, token: str, peers: PeerCheck | None = None) -> None:
        self._token = token.encode()
        self._peers = peers

    async def check(self, headers: Mapping[bytes, bytes]) -> None:
        """Take a request by its headers (lower-case names) or raise
        ``UnauthorizedError``; a ``TierFSError`` from the peer registry (its database
        is down and nothing is known yet) passes through for its own answer."""
        if not await self.allows(headers.get(b"authorization", b""), headers.get(_HOST_HEADER)):
            raise UnauthorizedError(UNAUTHORIZED_MESSAGE)

    async def allows(self, authorization: bytes, host: bytes | None) -> bool:
        """Whether a request with these ``Authorization`` and ``HOST_HEADER`` values
        (``host`` None: not sent) is taken."""
        scheme, _, given = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not given:
            return False
        if host is None:
            return hmac.compare_digest(given, self._token)
        if self._peers is None:
            return False
        return await self._peers(host.decode("utf-8", errors="replace"), given)
