"""``ls`` reads the per-directory index of the namespace (``SegmentTable.children``):
after random creates, mkdirs, renames of segments and whole directories, deletes and
rmdirs, and after a restart, every listing equals the one computed from every name."""

from __future__ import annotations

import random

from tierfs import StoreConfig, open_store
from tierfs.contracts import names
from tierfs.contracts.errors import TierFSError
from tierfs.contracts.reports.info import DirectoryInfo
from tierfs.store.facade import SegmentStore


async def _expected_listing(store: SegmentStore, directory: str) -> list[str]:
    every = [info.name for info in await store.walk_segments()] + list(store.table.directories)
    return sorted(name for name in every if names.parent_of(name) == directory)


async def _check_every_directory(store: SegmentStore) -> None:
    for directory in ["", *store.table.directories]:
        listed = [info.name for info in await store.list(directory)]
        assert listed == await _expected_listing(store, directory), directory
        subdirectories = sum(names.parent_of(d) == directory for d in store.table.directories)
        info = await store.stat(directory)
        assert isinstance(info, DirectoryInfo) and info.subdirectories == subdirectories, directory


async def test_listings_follow_every_namespace_change_and_a_restart(config: StoreConfig) -> None:
    rng = random.Random(16)
    async with open_store(config) as store:
        directories, segments = [""], []
        for step in range(400):
            action = rng.choice(["mkdir", "create", "create", "rename", "rename_dir", "delete", "rmdir"])
            parent = rng.choice(directories)
            fresh = (parent + "/" if parent else "") + f"n{step}"
            try:
                if action == "mkdir":
                    await store.mkdir(fresh)
                elif action == "create":
                    await store.create(fresh)
                elif action == "rename" and segments:
                    await store.rename(rng.choice(segments), fresh)
                elif action == "rename_dir" and len(directories) > 1:
                    await store.rename(rng.choice(directories[1:]), fresh)
                elif action == "delete" and segments:
                    await store.delete(rng.choice(segments))
                elif action == "rmdir" and len(directories) > 1:
                    await store.rmdir(rng.choice(directories[1:]))
            except TierFSError:
                pass  # e.g. a rename into its own subtree, rmdir of a non-empty directory
            directories = ["", *store.table.directories]
            segments = [info.name for info in await store.walk_segments()]
            if step % 50 == 0:
                await _check_every_directory(store)
        await _check_every_directory(store)
        before = {d: [i.name for i in await store.list(d)] for d in directories}
    async with open_store(config) as store:
        await _check_every_directory(store)
        assert {d: [i.name for i in await store.list(d)] for d in directories} == before
