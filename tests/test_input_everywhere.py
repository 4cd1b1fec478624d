"""Bad input is judged the same way whichever front end it came through: the in-process
store, ``RemoteStore`` over a real daemon, the ``tierfs`` command and fsspec give the
same error code, and nothing is created; names the engine accepts mean the same
segment everywhere (nothing on the way rewrites '..', '.', '//' or a trailing '/')."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from tierfs.fsspec_impl import TierFileSystem

from tierfs.contracts.errors import TierFSError
from tierfs.remote.client import TierClient
from tierfs.remote.remote_store import RemoteStore
from tierfs.store.facade import open_store
from tierfs.testing.cli_runner import run_tierfs
from tierfs.testing.harness import Daemon, small_config, start_daemon

# Every one of these is refused by names.canonical, in-process as over the daemon.
BAD_NAMES = [
    "..", ".", "../x", "a/..", "a/../b", "a/./b", "./a", "a//b", "//a", "a//",
    "a\x00b", "x" * 256, "/", "",
    # control characters: a newline fakes a listing entry, an escape drives the terminal
    "x\ny", "tab\there", "cr\rx", "esc\x1b[31m", "del\x7f",
]
# Accepted names that URL handling used to mangle or 404: the same segment everywhere.
ODD_GOOD_NAMES = ["q/", "/lead", "p%2Fq", "a?b", "h#sh", "sp ace", "%2E%2E", "é", "it's", "$HOME"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    process = start_daemon(tmp_path_factory.mktemp("input") / "data")
    try:
        yield process
    finally:
        process.stop()


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The command (in this process) against the daemon's process."""
    return run_tierfs("--data-dir", str(data_dir), *args)


def _all_names(client: TierClient, directory: str = "") -> set[str]:
    names = set()
    for entry in client.ls(directory):
        names.add(entry.name)
        if entry.type == "directory":
            names |= _all_names(client, entry.name)
    return names


async def _in_process_code(tmp_path: Path, name: str) -> str:
    async with open_store(small_config(tmp_path / "local")) as store:
        try:
            await store.create(name)
        except TierFSError as e:
            assert await store.walk_segments() == [] and not store.table.directories
            return e.code
        return "ok:" + (await store.stat(name)).name


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_name_same_code_everywhere(daemon: Daemon, tmp_path: Path, name: str) -> None:
    code = "name_too_long" if name == "x" * 256 else "invalid_name"
    assert trio.run(_in_process_code, tmp_path, name) == code
    client = daemon.client()
    before = _all_names(client)
    remote = RemoteStore(client)
    for call in (lambda: remote.create(name), lambda: remote.create(name, make_parents=True),
                 lambda: remote.mkdir(name, parents=True), lambda: remote.append(name, b"x")):
        with pytest.raises(TierFSError) as raised:
            trio.run(call)
        assert raised.value.code == code, (name, raised.value)
    response = client._http.put(f"/v1/segments/{client._path(name)}")
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    if "\x00" not in name:  # argv cannot carry a NUL
        result = _cli(daemon.data_dir, "create", "-p", name)
        assert result.returncode == 1 and f"({code})".encode() in result.stderr, result.stderr
    fs = TierFileSystem(data_dir=str(daemon.data_dir), direct_reads=False)
    if name not in ("/", ""):  # fsspec's root: a directory that exists
        with pytest.raises(ValueError, match="invalid name"):
            fs.pipe_file(name, b"x")
    assert _all_names(client) == before
    client.close()


@pytest.mark.parametrize("name", ODD_GOOD_NAMES, ids=repr)
def test_odd_good_name_means_one_segment_everywhere(daemon: Daemon, tmp_path: Path, name: str) -> None:
    expected = trio.run(_in_process_code, tmp_path, name)
    assert expected.startswith("ok:")
    client = daemon.client()
    info = client.create(name)
    assert "ok:" + info.name == expected
    assert client.append(name, b"abc") == 0
    assert client.read(name) == b"abc" and client.stat(name).name == info.name
    result = _cli(daemon.data_dir, "cat", name)
    assert result.returncode == 0 and result.stdout == b"abc", result.stderr
    client.delete(name)
    client.close()


def test_create_dotdot_path_makes_nothing_on_the_cli(daemon: Daemon) -> None:
    """The measured bug: ``create -p a/../b`` through the daemon created ``b``."""
    before = _all_names(daemon.client())
    result = _cli(daemon.data_dir, "create", "-p", "a/../b")
    assert result.returncode == 1 and b"(invalid_name)" in result.stderr
    assert _all_names(daemon.client()) == before


@pytest.mark.parametrize(
    "method, url, headers, status, code",
    [
        ("GET", "/v1/segments/r?follow=1&timeout=abc", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r?follow=1&timeout=nan", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r?follow=1&timeout=-1", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r?follow=1&offset=-1", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r?follow=maybe", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r?unconfirmed=2", {}, 400, "invalid_argument"),
        ("PUT", "/v1/segments/new?parents=sure", {}, 400, "invalid_argument"),
        ("POST", "/v1/segments/r?expected_offset=-3", {}, 400, "invalid_argument"),
        ("POST", "/v1/segments/r?expected_offset=x", {}, 400, "invalid_argument"),
        ("GET", "/v1/segments/r", {"Range": "bytes=5-2"}, 416, "invalid_range"),
        ("GET", "/v1/segments/r", {"Range": "bytes=-"}, 416, "invalid_range"),
        ("GET", "/v1/segments/r", {"Range": "bytes=0-1,3-4"}, 416, "invalid_range"),
        ("GET", "/v1/segments/r", {"Range": "lines=1-2"}, 416, "invalid_range"),
        ("GET", "/v1/segments/r", {"Range": "bytes=99-"}, 416, "out_of_range"),
    ],
)
def test_bad_query_and_range(daemon: Daemon, method: str, url: str, headers: dict[str, str],
                             status: int, code: str) -> None:
    client = daemon.client()
    if "r" not in {e.name for e in client.ls("")}:
        client.create("r")
        client.append("r", b"0123456789")
    response = client._http.request(method, url, headers=headers)
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    if status == 416:
        assert response.headers["Content-Range"] == "bytes */10"
    assert client.read("r") == b"0123456789" and "new" not in {e.name for e in client.ls("")}
    client.close()


@pytest.mark.parametrize("body", [{"path": "d", "parents": "yes"}, {"path": "d", "parents": "false"},
                                  {"path": "d", "parents": 2}, {"path": "d", "parents": None}])
def test_json_booleans_are_booleans(daemon: Daemon, body: dict[str, object]) -> None:
    client = daemon.client()
    response = client._http.post("/v1/op/mkdir", json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_argument"
    assert "d" not in {e.name for e in client.ls("")}
    client.close()


def test_concat_target_is_a_name(daemon: Daemon) -> None:
    client = daemon.client()
    response = client._http.post("/v1/op/concat", json={"target": 42, "source": "s"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_name"
    client.close()


# tail takes "-n -2" as GNU does (the last 2 lines; test_cli_tail.py compares it with GNU);
# what GNU refuses ("2x", "x") tierfs refuses too, with its usage exit code 2 (GNU's is 1).
@pytest.mark.parametrize("args", [["cat", "r", "--offset", "-1"], ["cat", "r", "--length", "-5"],
                                  ["append", "r", "x", "--expected-offset", "-1"],
                                  ["tail", "r", "-n", "2x"], ["tail", "r", "-c", "x"]])
def test_cli_refuses_negative_numbers(daemon: Daemon, args: list[str]) -> None:
    result = _cli(daemon.data_dir, *args)
    assert result.returncode == 2
    assert b"negative" in result.stderr or b"whole number" in result.stderr or b"invalid number of" in result.stderr


def test_remote_read_refuses_negative_like_in_process(daemon: Daemon, tmp_path: Path) -> None:
    async def codes(store: object) -> list[str]:
        found = []
        for offset, length in ((-1, None), (0, -5)):
            try:
                await store.read("r", offset, length)  # type: ignore[attr-defined]
            except TierFSError as e:
                found.append(e.code)
        return found

    async def in_process() -> list[str]:
        async with open_store(small_config(tmp_path / "local")) as store:
            await store.create("r")
            return await codes(store)

    client = daemon.client()
    if "r" not in {e.name for e in client.ls("")}:
        client.create("r")
    assert trio.run(codes, RemoteStore(client)) == trio.run(in_process) == ["invalid_argument"] * 2
    client.close()


def test_a_read_of_a_directory_or_the_root_fails_the_same_whatever_its_window(daemon: Daemon, tmp_path: Path) -> None:
    """An empty window (length 0) is no reason to skip the checks: the daemon is asked,
    and says what the in-process store says (the model test found RemoteStore answering
    b'' for a directory read with length 0)."""
    windows = ((0, None), (0, 0), (1, 0), (5, 3))

    async def codes(store: object) -> list[str]:
        found = []
        for name in ("dir", "/"):
            for offset, length in windows:
                try:
                    await store.read(name, offset, length)  # type: ignore[attr-defined]
                    found.append("success")
                except TierFSError as e:
                    found.append(e.code)
        return found

    async def in_process() -> list[str]:
        async with open_store(small_config(tmp_path / "local")) as store:
            await store.create("dir/s", make_parents=True)
            return await codes(store)

    client = daemon.client()
    if "dir" not in {e.name for e in client.ls("")}:
        client.create("dir/s", parents=True)
    expected = ["is_a_directory"] * len(windows) + ["invalid_name"] * len(windows)
    assert trio.run(codes, RemoteStore(client)) == trio.run(in_process) == expected
    client.close()


def test_percent_encoded_names_are_not_decoded_twice(daemon: Daemon) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.data_dir / "tierfs.sock")),
                      base_url="http://tierfs") as http:
        assert http.put("/v1/segments/%252E%252E").status_code == 201
        assert http.get("/v1/stat/%252E%252E").json()["name"] == "%2E%2E"
        assert http.delete("/v1/segments/%252E%252E").status_code == 204
    assert os.path.exists(daemon.data_dir)
