"""Whole-file rewrites on the mount (``O_TRUNC``, ``open("w")``, ``ftruncate(fd, 0)``
of a non-empty segment): refused by default, a name replacement where a directory's
policy allows it.

Tools that rewrite files whole (editors, build outputs, git, Spark's built-in writers)
need ``>`` on an existing file to work; logs need it never to destroy what was
appended. The policy key ``rewrite_replaces`` (``tierfs policy set DIR
rewrite_replaces=1``, inherited below DIR) decides per directory.

Invariants:
- The store decides (``rewrite``): without the policy the rewrite fails with EPERM
  before anything changes, and the daemon log says which policy would allow it.
- With it, the name is replaced by a new empty segment (same durability, mode and
  owner) in one metadata transaction: no moment without the name, nothing to clean
  up after a crash. No byte of the old segment changes; it is deleted like any
  replaced name, or lives on for the descriptors that hold it open.
- A sealed segment is never rewritten (its open for writing fails earlier: EPERM).
"""

from __future__ import annotations

import logging

from tierfs.contracts.errors import RewriteRefusedError
from tierfs.contracts.info import SegmentInfo
from tierfs.store.served import MountedStore

log = logging.getLogger("tierfs.fuse")


class WholeFileRewrites:
    def __init__(self, store: MountedStore) -> None:
        self._store = store

    async def replace_with_empty(self, info: SegmentInfo, what: str) -> SegmentInfo:
        """Replace ``info``'s name by a new empty segment, or raise EPERM (logged)."""
        try:
            return await self._store.rewrite(info.name)
        except RewriteRefusedError as refused:
            log.warning("refused %s of %r (%d bytes): %s", what, info.name, info.appended_length, refused)
            raise
