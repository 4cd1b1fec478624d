"""Chunk storage: the contract suite (``tierfs.testing.contract``) run against every
backend (local, memory://, s3://), and what is particular to each backend."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tierfs.blocks.filesystems import S3_CHECKSUM_DEFAULTS, open_filesystem
from tierfs.contracts.errors import InvalidArgumentError
from tierfs.engine.tier2.chunk_storage import (
    ChunkStorage,
    FsspecChunkStorage,
    LocalChunkStorage,
    open_chunk_storage,
)
from tierfs.testing.contract import (
    CHECKS,
    ContractViolation,
    check_all,
    check_append_capability,
    check_write_read_stat_list_delete,
)
from tierfs.testing.storages import WrappedStorage


@pytest.fixture(params=["local", "memory", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> ChunkStorage:
    if request.param == "local":
        return open_chunk_storage(str(tmp_path / "chunks"))
    if request.param == "memory":
        return open_chunk_storage(f"memory://chunks-{uuid.uuid4().hex}")
    url, options = request.getfixturevalue("s3_bucket")
    return open_chunk_storage(url, options)


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
def test_chunk_storage_contract(storage: ChunkStorage, check: Callable[[ChunkStorage], None]) -> None:
    """Every backend passes every check of ``tierfs.testing.contract``."""
    check(storage)


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


class _ClaimsNoAppend(WrappedStorage):
    """A local storage that says it cannot append, yet appends."""

    def __init__(self, inner: ChunkStorage) -> None:
        super().__init__(inner)
        self.supports_append = False


class _ListsUnsorted(WrappedStorage):
    def list(self, prefix: str = "") -> list[str]:
        return sorted(super().list(prefix), reverse=True)


def test_the_contract_catches_a_storage_that_breaks_it(tmp_path: Path) -> None:
    lying = _ClaimsNoAppend(open_chunk_storage(str(tmp_path / "a")))
    with pytest.raises(ContractViolation, match="InvalidArgumentError"):
        check_append_capability(lying)
    unsorted = _ListsUnsorted(open_chunk_storage(str(tmp_path / "b")))
    with pytest.raises(ContractViolation, match=r"list\(\"s1/\"\)"):
        check_write_read_stat_list_delete(unsorted)
    check_all(lambda: open_chunk_storage(f"memory://chunks-{uuid.uuid4().hex}"))
