"""Whole-file rewrites on the mount (``O_TRUNC``, ``open("w")``, ``ftruncate(fd, 0)``
of a non-empty segment): refused by default, a name replacement where a directory's
policy allows it.

Tools that rewrite files whole (editors, build outputs, git, Spark's built-in writers)
need ``>`` on an existing file to work; logs need it never to destroy what was
appended. The policy key ``rewrite_replaces`` (``tierfs policy set DIR
rewrite_replaces=1``, inherited below DIR) decides per directory.

Invariants:
- The store decides (``rewrite``): without the policy the rewrite fails with EPERM
  before anything changes, and the daemon log says which policy would allow it, unless
  the tool recovered by itself within ``RECOVERY_S`` by deleting the name and creating
  it again (git's ``fopen_for_writing`` does on EPERM): only a refusal the user met is
  worth a warning.
- With it, the name is replaced by a new empty segment (same durability, mode and
  owner) in one metadata transaction: no moment without the name, nothing to clean
  up after a crash. No byte of the old segment changes; it is deleted like any
  replaced name, or lives on for the descriptors that hold it open.
- A sealed segment is never rewritten (its open for writing fails earlier: EPERM).
- A Hadoop job (Spark's built-in writers) that would be refused at its commit is
  refused at its start instead (``check_job_start``): nothing it would have committed
  before the refusal is ever written.
"""

from __future__ import annotations

import logging
import math

import trio

from tierfs.contracts import names
from tierfs.contracts.errors import RewriteRefusedError, SegmentNotFoundError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.store.served import MountedStore

log = logging.getLogger("tierfs.fuse")

POLICY_KEY = "rewrite_replaces"
# Hadoop's FileOutputCommitter starts a job by making OUTPUT/_temporary and ends it,
# after moving the job's files into OUTPUT, by rewriting OUTPUT/_SUCCESS and, on a local
# file system, its checksum file ._SUCCESS.crc (a few bytes: a rewrite, not a create).
HADOOP_JOB_START = "_temporary"
HADOOP_SUCCESS_CHECKSUM = "._SUCCESS.crc"
RECOVERY_S = 2.0  # a refused rewrite whose name is deleted within this is not warned of


class WholeFileRewrites:
    def __init__(self, store: MountedStore) -> None:
        self._store = store
        self._refusals: dict[str, tuple[float, str]] = {}  # name -> (warn at, the warning)
        self._wake = trio.Event()

    def recovered(self, name: str) -> None:
        """``name`` was deleted: a refused rewrite of it was worked around."""
        self._refusals.pop(name, None)

    async def run(self) -> None:
        """Log the refusals nobody worked around (a task of the mount)."""
        while True:
            due_s = min((at for at, _ in self._refusals.values()), default=math.inf)
            with trio.move_on_at(due_s):
                await self._wake.wait()
                self._wake = trio.Event()
            now_s = trio.current_time()
            for name, (at, message) in list(self._refusals.items()):
                if at <= now_s:
                    del self._refusals[name]
                    log.warning("%s", message)

    def _refused(self, name: str, message: str) -> None:
        self._refusals[name] = (trio.current_time() + RECOVERY_S, message)
        self._wake.set()

    async def allowed(self, directory: str) -> bool:
        policy = await self._store.get_policy(directory)
        entry = policy["effective"].get(POLICY_KEY)
        return entry is not None and entry["value"] == 1

    async def check_job_start(self, made: str) -> None:
        """Before the directory ``made`` is created: if it is a Hadoop job's start in an
        output directory whose end the policy would refuse (an earlier job's
        ``._SUCCESS.crc`` to rewrite), refuse it now (EPERM, logged)."""
        output = names.parent_of(made)
        if names.basename(made) != HADOOP_JOB_START:
            return
        checksum = f"{output}/{HADOOP_SUCCESS_CHECKSUM}" if output else HADOOP_SUCCESS_CHECKSUM
        try:
            info = await self._store.stat(checksum)
        except SegmentNotFoundError:
            return
        if not isinstance(info, SegmentInfo) or info.appended_length == 0 or await self.allowed(output):
            return
        refused = RewriteRefusedError(checksum)
        log.warning("refused the start of a Hadoop/Spark job writing into %r (its commit would "
                    "rewrite %r after moving its files in): %s", output or "/", checksum, refused)
        raise refused

    async def replace_with_empty(self, info: SegmentInfo, what: str) -> SegmentInfo:
        """Replace ``info``'s name by a new empty segment, or raise EPERM (logged)."""
        try:
            return await self._store.rewrite(info.name)
        except RewriteRefusedError as refused:
            self._refused(info.name, f"refused {what} of {info.name!r} ({info.appended_length} bytes): {refused}")
            raise
