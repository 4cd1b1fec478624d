"""Static check, run by mypy (``[tool.mypy] files`` in pyproject.toml), not by pytest:
the in-process and the remote store both satisfy the public API protocols. If either
drifts (a method missing, renamed, made sync, or its arguments or result changed),
mypy fails on these assignments."""

from __future__ import annotations

from tierfs.contracts.api import SegmentReaderAPI, SegmentStoreAPI
from tierfs.engine.read.readahead import SegmentReader
from tierfs.remote.remote_store import RemoteReader, RemoteStore
from tierfs.store.facade import SegmentStore


def in_process_store(store: SegmentStore) -> SegmentStoreAPI:
    return store


def remote_store(store: RemoteStore) -> SegmentStoreAPI:
    return store


def in_process_reader(reader: SegmentReader) -> SegmentReaderAPI:
    return reader


def remote_reader(reader: RemoteReader) -> SegmentReaderAPI:
    return reader
