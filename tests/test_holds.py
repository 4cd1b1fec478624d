"""A descriptor holds its file, not its name (``store.holds``): deleting, replacing or
rewriting a held segment through the API detaches it in the same transaction; it keeps
serving its holds under a name no user can give, and goes at the last release or when
the store opens again. Every legal name is the user's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tierfs import open_store
from tierfs.contracts import names
from tierfs.contracts.errors import (
    InvalidNameError,
    RewriteRefusedError,
    SegmentNotFoundError,
    SegmentSealedError,
)
from tierfs.testing.harness import small_config


async def _segments(store: object) -> int:
    return (await store.fsck()).segments  # type: ignore[attr-defined]


async def test_a_held_segment_deleted_lives_on_until_its_last_release(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        await store.mkdir("dir")
        await store.create("dir/c")
        await store.append("dir/c", b"kept")
        first, second = await store.hold("dir/c"), await store.hold("dir/c")
        await store.delete("dir/c")
        assert first.detached and names.is_detached(first.name)
        assert await store.list("dir") == [] and await store.walk_segments() == []
        with pytest.raises(SegmentNotFoundError):
            await store.stat("dir/c")
        await store.rmdir("dir")  # only a detached entry was left: it is empty
        assert await first.append(b"+more") == 4
        assert await first.sync() == 9
        assert await second.read(0) == b"kept+more"
        assert (await second.info()).length == 9
        await first.release()
        assert await _segments(store) == 1
        await first.release()  # once per hold
        await second.release()
        assert await _segments(store) == 0
        with pytest.raises(SegmentNotFoundError):
            await second.read(0)


async def test_rename_over_a_held_segment_is_atomic_and_keeps_it_for_its_holder(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        for name, data in (("a", b"A"), ("b", b"B")):
            await store.create(name)
            await store.append(name, data)
        held = await store.hold("b")
        await store.rename("a", "b")
        assert await store.read("b") == b"A"
        assert await held.read(0) == b"B" and held.detached
        await store.rename("b", "c")  # the hold follows its own file, not the name
        assert await held.read(0) == b"B"
        follows = await store.hold("c")
        await store.rename("c", "d")
        assert follows.name == "d" and not follows.detached
        await held.release()
        await follows.release()
        assert [i.name for i in await store.list("")] == ["d"] and await _segments(store) == 1


async def test_a_rewrite_replaces_in_one_step_only_where_the_policy_allows(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        await store.mkdir("logs")
        await store.mkdir("build")
        await store.set_policy("build", {"rewrite_replaces": 1})
        for name in ("logs/app.log", "build/out", "build/sealed"):
            await store.create(name, durability="vd")
            await store.append(name, b"old")
        await store.set_attributes("build/out", mode=0o600)
        with pytest.raises(RewriteRefusedError, match="rewrite_replaces=1"):
            await store.rewrite("logs/app.log")
        assert await store.read("logs/app.log") == b"old"
        await store.seal("build/sealed")
        with pytest.raises(SegmentSealedError):
            await store.rewrite("build/sealed")
        held = await store.hold("build/out")
        new = await store.rewrite("build/out")
        assert (new.length, new.durability, new.mode) == (0, "vd", 0o600)
        assert await store.read("build/out") == b"" and await held.read(0) == b"old"
        await held.release()
        assert await _segments(store) == 3


async def test_detached_segments_left_by_a_stop_are_deleted_when_the_store_opens(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d")
    async with open_store(config) as store:
        await store.create("open-at-the-crash")
        await store.append("open-at-the-crash", b"x" * 1000)
        await store.hold("open-at-the-crash")  # never released: the process "died" holding it
        await store.delete("open-at-the-crash")
        await store.flush()
        assert await _segments(store) == 1
    async with open_store(config) as store:
        assert await _segments(store) == 0 and await store.list("") == []


async def test_every_legal_name_is_the_users_and_no_user_name_is_a_detached_one(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d")
    async with open_store(config) as store:
        await store.create(".tierfs-unlinked.7")  # the prefix earlier releases kept for themselves
        await store.append(".tierfs-unlinked.7", b"mine")
        with pytest.raises(InvalidNameError):
            await store.create(names.detached_name(7))
    async with open_store(config) as store:
        assert [i.name for i in await store.list("")] == [".tierfs-unlinked.7"]
        assert await store.read(".tierfs-unlinked.7") == b"mine"


async def test_a_data_dir_of_an_earlier_release_loses_its_hidden_leftovers_and_nothing_else(tmp_path: Path) -> None:
    config = small_config(tmp_path / "d")
    async with open_store(config) as store:
        await store.mkdir("dir")
        for name in ("dir/kept", "dir/.tierfs-unlinked.12", "dir/x.tierfs-unlinked.1"):
            await store.create(name)
    with sqlite3.connect(config.data_dir / "metadata.sqlite") as db:  # as that release left it
        db.execute("DELETE FROM schema_version")
        db.execute("INSERT INTO schema_version (version) VALUES (3)")
    async with open_store(config) as store:
        assert [i.name for i in await store.list("dir")] == ["dir/kept", "dir/x.tierfs-unlinked.1"]
        assert await _segments(store) == 2


async def test_a_sealed_name_is_replaced_by_rename_only_under_the_rewrite_policy(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        for directory in ("plain", "git"):
            await store.mkdir(directory)
            for name in ("pack", "pack.tmp"):
                await store.create(f"{directory}/{name}")
                await store.append(f"{directory}/{name}", name.encode())
            await store.seal(f"{directory}/pack")
        await store.set_policy("git", {"rewrite_replaces": 1})
        with pytest.raises(SegmentSealedError):
            await store.rename("plain/pack.tmp", "plain/pack")
        assert await store.read("plain/pack") == b"pack"
        held = await store.hold("git/pack")
        await store.rename("git/pack.tmp", "git/pack")
        assert await store.read("git/pack") == b"pack.tmp"
        assert await held.read(0) == b"pack" and (await held.info()).sealed  # itself unchanged
        await held.release()


async def test_directories_have_ids_from_the_segments_sequence_kept_across_rename_and_reopen(
    tmp_path: Path,
) -> None:
    config = small_config(tmp_path / "d")
    async with open_store(config) as store:
        await store.mkdir("a/b", parents=True)
        seg = await store.create("a/b/s")
        a, b = await store.stat("a"), await store.stat("a/b")
        ids = {a.directory_id, b.directory_id, seg.segment_id}  # type: ignore[union-attr]
        assert len(ids) == 3 and 0 not in ids
        await store.rename("a", "c")
        assert (await store.stat("c")).directory_id == a.directory_id  # type: ignore[union-attr]
        await store.mkdir("c/later")
        later = (await store.stat("c/later")).directory_id  # type: ignore[union-attr]
        assert later > max(ids)
    with sqlite3.connect(config.data_dir / "metadata.sqlite") as db:
        # a restore's change log brings back rows, not the sequence a mkdir moved
        db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'segments'", (seg.segment_id,))
        # and a directory of a release before ids has none
        db.execute("INSERT INTO directories (name, value) VALUES ('old', x'')")
    async with open_store(config) as store:
        assert (await store.stat("c/b")).directory_id == b.directory_id  # type: ignore[union-attr]
        old = (await store.stat("old")).directory_id  # type: ignore[union-attr]
        new = (await store.create("new")).segment_id
        assert len({*ids, later, old, new}) == 6 and min(old, new) > later


async def test_a_rename_moves_the_ctime_of_what_it_moves(tmp_path: Path) -> None:
    async with open_store(small_config(tmp_path / "d")) as store:
        await store.mkdir("dir")
        await store.create("dir/f")
        await store.append("dir/f", b"x")
        await store.flush()
        before = [(await store.stat(name)).ctime_ns for name in ("dir", "dir/f")]
        await store.rename("dir/f", "dir/g")
        await store.rename("dir", "moved")
        after = [(await store.stat(name)).ctime_ns for name in ("moved", "moved/g")]
        assert all(a > b for a, b in zip(after, before, strict=True))
        await store.append("moved/g", b"y")
        await store.flush()  # a flush after the rename commits at the new revision
        assert await store.read("moved/g") == b"xy"
