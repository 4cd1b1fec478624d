"""Bad input to every operation gets a clear error and changes nothing."""

from __future__ import annotations

import pytest

from tierfs.contracts.errors import (
    BadOffsetError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    InvalidNameError,
    IsADirectoryError_,
    NotADirectoryError_,
    OffsetOutOfRangeError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    TierFSError,
)
from tierfs.store.facade import SegmentStore

BAD_NAMES = ["", "../x", "a/../b", "a//b", "a\x00b", "x" * 256, ".", 42]


async def _snapshot(store: SegmentStore) -> tuple:
    segments = await store.walk_segments()
    return (
        tuple((s.name, s.appended_length, s.sealed, s.durability) for s in segments),
        tuple(sorted(store.table.directories)),
        store.journal.written_lsn + store.journal._queued_bytes,
    )


@pytest.fixture
async def populated(store: SegmentStore) -> SegmentStore:
    await store.mkdir("dir")
    await store.create("dir/seg")
    await store.append("dir/seg", b"0123456789")
    await store.create("sealed")
    await store.seal("sealed")
    await store.mkdir("other")
    return store


OPERATIONS = {
    "create": lambda s, n: s.create(n),
    "append": lambda s, n: s.append(n, b"x"),
    "read": lambda s, n: s.read(n),
    "stat": lambda s, n: s.stat(n),
    "list": lambda s, n: s.list(n),
    "mkdir": lambda s, n: s.mkdir(n),
    "rmdir": lambda s, n: s.rmdir(n),
    "seal": lambda s, n: s.seal(n),
    "unseal": lambda s, n: s.unseal(n),
    "delete": lambda s, n: s.delete(n),
    "rename-from": lambda s, n: s.rename(n, "fresh"),
    "rename-to": lambda s, n: s.rename("dir/seg", n),
    "sync": lambda s, n: s.sync(n),
    "set_durability": lambda s, n: s.set_durability(n, "vd"),
    "set_attributes": lambda s, n: s.set_attributes(n, mtime_ns=1),
    "chunk_layout": lambda s, n: s.chunk_layout(n),
    "defrag": lambda s, n: s.defrag(n),
}


# '' names the root directory, which stat, list and set_attributes accept.
NAME_CASES = [
    (operation, name)
    for operation in sorted(OPERATIONS)
    for name in BAD_NAMES
    if not (name == "" and operation in ("stat", "list", "set_attributes"))
]


@pytest.mark.parametrize("operation, bad_name", NAME_CASES, ids=repr)
async def test_bad_names_change_nothing(populated: SegmentStore, operation: str, bad_name) -> None:  # type: ignore[no-untyped-def]
    before = await _snapshot(populated)
    with pytest.raises(InvalidNameError):
        await OPERATIONS[operation](populated, bad_name)
    assert await _snapshot(populated) == before


CASES = [
    ("append to missing", lambda s: s.append("nope", b"x"), SegmentNotFoundError),
    ("append to a directory", lambda s: s.append("dir", b"x"), IsADirectoryError_),
    ("append non-bytes", lambda s: s.append("dir/seg", "text"), InvalidArgumentError),
    ("append too large", lambda s: s.append("dir/seg", b"x" * (s.config.max_append_bytes + 1)), InvalidArgumentError),
    ("append to sealed", lambda s: s.append("sealed", b"x"), SegmentSealedError),
    ("append bad expected offset", lambda s: s.append("dir/seg", b"x", expected_offset=3), BadOffsetError),
    ("append negative expected offset", lambda s: s.append("dir/seg", b"x", expected_offset=-1), InvalidArgumentError),
    ("read negative offset", lambda s: s.read("dir/seg", -1), InvalidArgumentError),
    ("read negative length", lambda s: s.read("dir/seg", 0, -5), InvalidArgumentError),
    ("read past end", lambda s: s.read("dir/seg", 11), OffsetOutOfRangeError),
    ("read a directory", lambda s: s.read("dir"), IsADirectoryError_),
    ("create existing", lambda s: s.create("dir/seg"), SegmentExistsError),
    ("create over directory", lambda s: s.create("dir"), SegmentExistsError),
    ("create in missing dir", lambda s: s.create("nodir/x"), SegmentNotFoundError),
    ("create under a segment", lambda s: s.create("dir/seg/x"), NotADirectoryError_),
    ("create bad durability", lambda s: s.create("x", durability="maybe"), InvalidArgumentError),
    ("mkdir existing", lambda s: s.mkdir("dir"), SegmentExistsError),
    ("mkdir over segment", lambda s: s.mkdir("dir/seg"), SegmentExistsError),
    ("mkdir in missing dir", lambda s: s.mkdir("a/b"), SegmentNotFoundError),
    ("rmdir non-empty", lambda s: s.rmdir("dir"), DirectoryNotEmptyError),
    ("rmdir a segment", lambda s: s.rmdir("dir/seg"), NotADirectoryError_),
    ("rmdir missing", lambda s: s.rmdir("nope"), SegmentNotFoundError),
    ("list a segment", lambda s: s.list("dir/seg"), NotADirectoryError_),
    ("list missing", lambda s: s.list("nope"), SegmentNotFoundError),
    ("delete missing", lambda s: s.delete("nope"), SegmentNotFoundError),
    ("delete a directory", lambda s: s.delete("dir"), IsADirectoryError_),
    ("seal missing", lambda s: s.seal("nope"), SegmentNotFoundError),
    ("rename missing", lambda s: s.rename("nope", "x"), SegmentNotFoundError),
    ("rename onto a sealed segment", lambda s: s.rename("dir/seg", "sealed"), SegmentSealedError),
    ("rename a segment onto a directory", lambda s: s.rename("sealed", "dir"), IsADirectoryError_),
    ("rename a directory onto a segment", lambda s: s.rename("dir", "sealed"), NotADirectoryError_),
    ("rename onto a non-empty directory", lambda s: s.rename("other", "dir"), DirectoryNotEmptyError),
    ("set_attributes bad mode", lambda s: s.set_attributes("dir/seg", mode=0o100644), InvalidArgumentError),
    ("set_attributes negative time", lambda s: s.set_attributes("dir/seg", mtime_ns=-1), InvalidArgumentError),
    ("set_attributes bool uid", lambda s: s.set_attributes("dir/seg", uid=True), InvalidArgumentError),
    ("rename into missing dir", lambda s: s.rename("sealed", "nodir/x"), SegmentNotFoundError),
    ("rename onto itself", lambda s: s.rename("dir", "dir"), InvalidArgumentError),
    ("rename dir inside itself", lambda s: s.rename("dir", "dir/sub"), InvalidArgumentError),
    ("sync missing", lambda s: s.sync("nope"), SegmentNotFoundError),
    ("set_durability bad level", lambda s: s.set_durability("sealed", "x"), InvalidArgumentError),
    ("set_durability non-empty", lambda s: s.set_durability("dir/seg", "vd"), InvalidArgumentError),
]


@pytest.mark.parametrize("call, error", [(c, e) for _, c, e in CASES], ids=[n for n, _, _ in CASES])
async def test_bad_arguments_change_nothing(populated: SegmentStore, call, error) -> None:  # type: ignore[no-untyped-def]
    before = await _snapshot(populated)
    with pytest.raises(error) as excinfo:
        await call(populated)
    assert isinstance(excinfo.value, TierFSError)
    assert str(excinfo.value)
    assert await _snapshot(populated) == before
    assert await populated.read("dir/seg") == b"0123456789"
