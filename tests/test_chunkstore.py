"""One contract suite for every chunk storage backend (local, memory://, s3://)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tierfs.blocks.filesystems import S3_CHECKSUM_DEFAULTS, open_filesystem
from tierfs.contracts.errors import ChunkMissingError, InvalidArgumentError
from tierfs.engine.chunkstore import (
    ChunkStorage,
    FsspecChunkStorage,
    LocalChunkStorage,
    open_chunk_storage,
)


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


def test_s3_defaults_ask_for_checksums_only_where_required() -> None:
    fs, _ = open_filesystem("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:1"})
    assert fs.config_kwargs == S3_CHECKSUM_DEFAULTS
    override = {"config_kwargs": {"request_checksum_calculation": "when_supported"}}
    fs, _ = open_filesystem("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:1", **override})
    assert fs.config_kwargs["request_checksum_calculation"] == "when_supported"
    assert fs.config_kwargs["response_checksum_validation"] == "when_required"
    fs, _ = open_filesystem("memory://x")
    assert not hasattr(fs, "config_kwargs")


def test_s3_chunk_puts_carry_no_second_checksum(s3_bucket: tuple[str, dict[str, object]]) -> None:
    url, options = s3_bucket
    storage = open_chunk_storage(url, options)
    assert isinstance(storage, FsspecChunkStorage)
    storage.write("first", 0, b"x")  # connects the client
    sent: list[dict[str, str]] = []
    storage.fs.s3.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers))
    )
    storage.write("second", 0, b"chunk bytes")
    assert storage.read("second", 0, 11) == b"chunk bytes"
    assert len(sent) == 1
    assert not [name for name in sent[0] if name.lower().startswith("x-amz-checksum")], sent[0]
