"""One contract suite for every chunk storage backend (local, memory://, s3://)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierfs.chunkstore import ChunkStorage, LocalChunkStorage, open_chunk_storage
from tierfs.errors import ChunkMissingError, InvalidArgumentError


@pytest.fixture(params=["local", "memory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> ChunkStorage:
    if request.param == "local":
        return open_chunk_storage(str(tmp_path / "chunks"))
    if request.param == "memory":
        return open_chunk_storage(f"memory://chunks-{uuid.uuid4().hex}")
    url, options = request.getfixturevalue("s3_bucket")
    return open_chunk_storage(url, options)


def test_write_read_stat_list_delete(storage: ChunkStorage) -> None:
    storage.write("s1/e1-c1", 0, b"0123456789")
    storage.write("s1/e1-c2", 0, b"abc")
    assert storage.read("s1/e1-c1", 2, 5) == b"234"
    assert storage.stat("s1/e1-c1") == 10
    assert storage.list("s1/") == ["s1/e1-c1", "s1/e1-c2"]
    storage.delete("s1/e1-c1")
    storage.delete("s1/e1-c1")  # deleting a missing chunk is fine
    assert storage.list() == ["s1/e1-c2"]
    with pytest.raises(ChunkMissingError):
        storage.read("s1/e1-c1", 0, 1)
    with pytest.raises(ChunkMissingError):
        storage.stat("nope")


def test_append_capability(storage: ChunkStorage) -> None:
    storage.write("c", 0, b"abc")
    if storage.supports_append:
        storage.write("c", 3, b"def")
        storage.write("c", 3, b"DEF")  # a retried append lands at the same place
        assert storage.read("c", 0, 6) == b"abcDEF"
    else:
        with pytest.raises(InvalidArgumentError):
            storage.write("c", 3, b"def")


def test_local_storage_is_chosen_for_paths(tmp_path: Path) -> None:
    assert isinstance(open_chunk_storage(str(tmp_path)), LocalChunkStorage)
    assert isinstance(open_chunk_storage(f"file://{tmp_path}"), LocalChunkStorage)
    with pytest.raises(InvalidArgumentError):
        open_chunk_storage("nosuchprotocol://x")
