"""Whole-file rewrites on the mount (``O_TRUNC``, ``open("w")``, ``ftruncate(fd, 0)``
of a non-empty segment): refused by default, a name replacement where a directory's
policy allows it.

Tools that rewrite files whole (editors, build outputs, git, Spark's built-in writers)
need ``>`` on an existing file to work; logs need it never to destroy what was
appended. The policy key ``rewrite_replaces`` (``tierfs policy set DIR
rewrite_replaces=1``, inherited below DIR) decides per directory.

Invariants:
- Without the policy the rewrite fails with EPERM before anything changes, and the
  daemon log says which policy would allow it.
- With it, the name is replaced atomically by a new empty segment (same durability,
  mode and owner): created under a hidden name in the same directory, then renamed
  onto the old name (POSIX rename replaces). No byte of the old segment changes; it
  is deleted by the rename, like any replaced name. A crash between the two steps
  leaves only the hidden empty segment, which the store removes when it opens.
- A sealed segment is never rewritten (its open for writing fails earlier: EPERM).
"""

from __future__ import annotations

import errno
import logging
import secrets

import pyfuse3

from tierfs.contracts import names
from tierfs.contracts.info import SegmentInfo
from tierfs.store.served import MountedStore

log = logging.getLogger("tierfs.fuse")

POLICY_KEY = "rewrite_replaces"
# hidden from listings and removed when the store opens (names.is_unlinked_leftover)
HIDDEN_PREFIX = names.UNLINKED_PREFIX


class WholeFileRewrites:
    def __init__(self, store: MountedStore) -> None:
        self._store = store

    async def allowed(self, name: str) -> bool:
        policy = await self._store.get_policy(names.parent_of(name))
        entry = policy["effective"].get(POLICY_KEY)
        return entry is not None and entry["value"] == 1

    async def replace_with_empty(self, info: SegmentInfo, what: str) -> SegmentInfo:
        """Replace ``info``'s name by a new empty segment, or raise EPERM (logged)."""
        name = info.name
        if not await self.allowed(name):
            directory = names.parent_of(name) or "/"
            log.warning(
                "refused %s of %r (%d bytes; append-only): to let rewrites replace files "
                "in %s, run: tierfs policy set %s %s=1", what, name, info.appended_length,
                directory, directory, POLICY_KEY,
            )
            raise pyfuse3.FUSEError(errno.EPERM)
        parent = names.parent_of(name)
        hidden = f"{HIDDEN_PREFIX}rewrite-{info.segment_id}-{secrets.token_hex(4)}"
        temporary = f"{parent}/{hidden}" if parent else hidden
        await self._store.create(temporary, durability=info.durability)
        await self._store.set_attributes(temporary, mode=info.mode, uid=info.uid, gid=info.gid)
        await self._store.rename(temporary, name)
        replaced = await self._store.stat(name)
        assert isinstance(replaced, SegmentInfo)
        return replaced
