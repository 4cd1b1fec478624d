"""``SegmentStoreAPI``: the in-process and the remote store offer the same methods with
the same parameters (mypy checks the types, ``tests/api_conformance.py``), and the
remote one, against a real daemon, gives the results the API promises."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import pytest

from tierfs.contracts.api import SegmentReaderAPI, SegmentStoreAPI
from tierfs.contracts.errors import InvalidArgumentError, SegmentNotFoundError
from tierfs.contracts.reports.fsck import FsckReport
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.engine.read.readahead import SegmentReader
from tierfs.remote.remote_store import RemoteReader, RemoteStore
from tierfs.store.facade import SegmentStore
from tierfs.testing.harness import Daemon


def _members(protocol: type) -> list[str]:
    return sorted(
        name for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )


def _shape(function: Callable[..., object]) -> list[tuple[str, object, object]]:
    parameters = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters]


@pytest.mark.parametrize("implementation", [SegmentStore, RemoteStore])
@pytest.mark.parametrize("name", _members(SegmentStoreAPI))
def test_both_stores_have_every_api_method(name: str, implementation: type) -> None:
    expected, actual = getattr(SegmentStoreAPI, name), getattr(implementation, name)
    assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(expected)
    assert _shape(actual) == _shape(expected)


@pytest.mark.parametrize("implementation", [SegmentReader, RemoteReader])
def test_both_readers_read_alike(implementation: type) -> None:
    assert _members(SegmentReaderAPI) == ["name", "read"]
    assert inspect.iscoroutinefunction(implementation.read)
    assert _shape(implementation.read) == _shape(SegmentReaderAPI.read)


def test_the_api_is_the_whole_remote_store() -> None:
    """RemoteStore offers nothing beyond the API but its generic ``op``."""
    public = {name for name in vars(RemoteStore) if not name.startswith("_")}
    assert public == set(_members(SegmentStoreAPI)) | {"op"}


@pytest.fixture
def remote(daemon: Daemon) -> Iterator[RemoteStore]:
    client = daemon.client()
    yield RemoteStore(client)
    client.close()


async def test_the_remote_store_keeps_the_promises_of_the_api(remote: RemoteStore) -> None:
    await remote.mkdir("api/in", parents=True, exist_ok=True)
    created = await remote.create("api/in/s")
    assert isinstance(created, SegmentInfo) and created.length == 0
    assert (await remote.set_durability("api/in/s", "vd")).durability == "vd"
    assert await remote.append("api/in/s", b"abc") == 0
    assert await remote.sync("api/in/s") == 3
    assert isinstance(await remote.sync(), int)
    await remote.flush()
    sealed = await remote.seal("api/in/s")
    assert isinstance(sealed, SegmentInfo) and sealed.sealed
    await remote.create("api/t")
    joined = await remote.concat("api/t", "api/in/s", writer="w", writer_seq=1)
    assert isinstance(joined, SegmentInfo) and joined.length == 3
    assert (await remote.unseal("api/t")).sealed is False
    assert await remote.open_reader("api/t").read(1, 5) == b"bc"
    await remote.rename("api/t", "api/u")
    await remote.rmdir("api/in")
    assert [e.name for e in await remote.list("api")] == ["api/u"]

    policy = await remote.set_policy("api", {"offload_after_s": 60, "retention_s": None})
    assert policy["set"] == {"offload_after_s": 60}
    assert (await remote.get_policy("api/u"))["effective"]["offload_after_s"] == {"value": 60, "from": "api"}
    policy = await remote.set_policy("api", {"offload_after_s": None})
    assert policy["set"] == {} and policy == await remote.get_policy("api")
    with pytest.raises(InvalidArgumentError, match="at or above"):
        await remote.set_policy("api", {"offload_after_s": 10, "retention_s": 5})

    report = await remote.fsck()
    assert isinstance(report, FsckReport) and report.problems == []
    assert report.segments >= 1 and report.bytes_checked >= 3
    assert (await remote.offload_status("api/u"))["state"] == "NOT_RUN"
    await remote.delete("api/u")
    with pytest.raises(SegmentNotFoundError):
        await remote.stat("api/u")
