"""The fsspec plugin against a real daemon: API, pickling, the fsspec abstract suite,
many processes appending and following."""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys
import textwrap

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)
from tierfs.fsspec_impl import TierFileSystem

from tierfs.contracts import operations as ops
from tierfs.testing.harness import Daemon


def test_open_read_append_and_info(tfs: TierFileSystem) -> None:
    with fsspec.open("tierfs://api/app.log", "wb") as f:
        f.write(b"hello\n")
    with fsspec.open("tierfs://api/app.log", "ab") as f:
        f.write(b"world\n")
        f.flush()
        assert tfs.info("api/app.log")["size"] == 12  # the flush was one append
        f.write(b"!\n")
    with fsspec.open("tierfs://api/app.log", "rb") as f:
        assert f.read() == b"hello\nworld\n!\n"
        f.seek(6)
        assert f.read(5) == b"world"
    assert tfs.cat_file("api/app.log", start=6, end=11) == b"world"
    assert tfs.cat_file("api/app.log", start=-2) == b"!\n"
    assert tfs.cat_ranges(["api/app.log"] * 2, [0, 6], [5, 11]) == [b"hello", b"world"]
    info = tfs.info("tierfs://api/app.log")
    assert (info["type"], info["size"], info["durability"]) == ("file", 14, "pd")
    assert tfs.ls("api", detail=False) == ["api/app.log"]
    assert tfs.ls("api/app.log") == [info]  # a file lists itself
    assert tfs.exists("api/app.log") and not tfs.exists("api/nope")
    with pytest.raises(FileNotFoundError):
        tfs.info("api/nope")
    with pytest.raises(FileNotFoundError):
        tfs.ls("api/nope")


def test_append_only_rules(tfs: TierFileSystem) -> None:
    tfs.pipe_file("rules/a", b"data")
    with pytest.raises(FileExistsError):
        tfs.pipe_file("rules/a", b"again")
    with pytest.raises(FileExistsError):
        tfs.open("rules/a", "wb")
    with pytest.raises(FileExistsError):
        tfs.open("rules/a", "xb")
    cached = fsspec.filesystem("simplecache", fs=tfs)
    with pytest.raises(FileExistsError) as refused:  # 'ab' through a cache uploads the whole file
        with cached.open("rules/a", "ab") as f:
            f.write(b"more")
    assert "caching layers (simplecache::, filecache::) upload a whole file" in str(refused.value)
    mtime = tfs.info("rules/a")["mtime"]
    tfs.touch("rules/a")  # as touch on the mount: the times move, no byte changes
    assert tfs.cat_file("rules/a") == b"data"
    assert tfs.info("rules/a")["mtime"] > mtime
    with tfs.open("rules/empty", "wb"):
        pass
    with tfs.open("rules/empty", "wb") as f:  # an empty segment may be written
        f.write(b"ok")
    assert tfs.cat_file("rules/empty") == b"ok"


def test_namespace_operations(tfs: TierFileSystem) -> None:
    tfs.makedirs("ns/a/b", exist_ok=True)
    tfs.makedirs("ns/a/b", exist_ok=True)
    with pytest.raises(FileExistsError):
        tfs.makedirs("ns/a/b")
    tfs.pipe_file("ns/a/b/f", b"1")
    tfs.mv("ns/a", "ns/c")
    assert tfs.cat_file("ns/c/b/f") == b"1"
    tfs.rm("ns", recursive=True)
    assert not tfs.exists("ns")


def test_sizes_are_never_stale(tfs: TierFileSystem) -> None:
    tfs.pipe_file("grow", b"a")
    assert tfs.ls("", detail=True)  # would populate a listings cache
    assert tfs.size("grow") == 1
    tfs.append("grow", b"bc")
    assert tfs.size("grow") == 3
    assert [e["size"] for e in tfs.ls("") if e["name"] == "grow"] == [3]


def test_instances_pickle(tfs: TierFileSystem) -> None:
    tfs.pipe_file("pickled", b"still here")
    clone = pickle.loads(pickle.dumps(tfs))
    assert clone.cat_file("pickled") == b"still here"
    with tfs.open("pickled", "rb") as f:
        reopened = pickle.loads(pickle.dumps(f))
        assert reopened.read() == b"still here"


def test_follow_iterator(tfs: TierFileSystem) -> None:
    tfs.pipe_file("followed", b"one\n")
    stream = tfs.follow("followed")
    assert next(stream) == b"one\n"
    tfs.append("followed", b"two\n")
    assert next(stream) == b"two\n"


WRITER = textwrap.dedent('''
    import sys, fsspec
    fs = fsspec.filesystem("tierfs")
    writer = sys.argv[1]
    with fs.open("multi/shared.log", "ab") as f:
        for i in range(200):
            f.write(f"<{writer}:{i}:".encode() + b"x" * (i % 50) + b">\\n")
            f.flush()
''')
FOLLOWER = textwrap.dedent('''
    import sys, fsspec
    fs = fsspec.filesystem("tierfs")
    seen = b""
    for data in fs.follow("multi/shared.log"):
        seen += data
        if seen.count(b"\\n") >= 400:
            break
    sys.stdout.buffer.write(seen)
''')


def test_two_processes_append_while_a_third_follows(tfs: TierFileSystem, daemon: Daemon) -> None:
    tfs.pipe_file("multi/shared.log", b"")
    env = {"TIERFS_DATA_DIR": str(daemon.data_dir), "PATH": ""}
    follower = subprocess.Popen([sys.executable, "-c", FOLLOWER], stdout=subprocess.PIPE, env=env)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, name], env=env) for name in "ab"]
    for proc in writers:
        assert proc.wait(timeout=120) == 0
    followed, _ = follower.communicate(timeout=120)
    data = tfs.cat_file("multi/shared.log")
    assert followed == data
    records = data.split(b"\n")[:-1]
    assert len(records) == 400
    for writer in "ab":
        mine = [r for r in records if r.startswith(f"<{writer}:".encode())]
        assert [int(r.split(b":")[1]) for r in mine] == list(range(200))  # none lost, in order
        assert all(r == f"<{writer}:{i}:".encode() + b"x" * (i % 50) + b">" for i, r in enumerate(mine))


class TierFixtures(AbstractFixtures):
    @pytest.fixture
    def fs(self, tfs: TierFileSystem) -> TierFileSystem:
        return tfs

    @pytest.fixture
    def fs_path(self, tfs: TierFileSystem, request: pytest.FixtureRequest) -> str:
        digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
        return f"conformance/{request.node.originalname}-{digest}"


OVERWRITE_REASON = "segments are append-only: this case overwrites an existing file"


class TestTierCopy(AbstractCopyTests, TierFixtures):
    pass


class TestTierGet(AbstractGetTests, TierFixtures):
    pass


class TestTierPut(AbstractPutTests, TierFixtures):
    pass


class TestTierOpen(AbstractOpenTests, TierFixtures):
    pass


class TestTierPipe(AbstractPipeTests, TierFixtures):
    @pytest.mark.xfail(reason=OVERWRITE_REASON, raises=FileExistsError, strict=True)
    def test_pipe_exclusive(self, fs, fs_target):  # type: ignore[no-untyped-def]
        super().test_pipe_exclusive(fs, fs_target)


def test_mv_onto_an_existing_file_replaces_it_unless_it_is_sealed(tfs: TierFileSystem) -> None:
    tfs.pipe_file("mv-replace/new", b"new contents")
    tfs.pipe_file("mv-replace/old", b"old contents")
    with tfs.open("mv-replace/old", "rb") as reader:
        tfs.mv("mv-replace/new", "mv-replace/old")  # POSIX rename: atomic replace
        # A file opened through fsspec reads by name, so once the name holds another
        # segment it fails clearly instead of returning the other segment's bytes
        # (on the mount an open descriptor keeps reading the segment it opened).
        with pytest.raises(FileNotFoundError, match="replaced since it was opened"):
            reader.read()
    assert tfs.cat_file("mv-replace/old") == b"new contents"
    assert tfs.ls("mv-replace", detail=False) == ["mv-replace/old"]
    tfs.pipe_file("mv-replace/sealed", b"sealed")
    tfs.pipe_file("mv-replace/other", b"other")
    tfs.client.call(ops.SEAL, "mv-replace/sealed")
    with pytest.raises(PermissionError, match="sealed"):
        tfs.mv("mv-replace/other", "mv-replace/sealed")
    assert tfs.cat_file("mv-replace/sealed") == b"sealed"


def test_a_file_dropped_without_close_sends_nothing_from_its_finalizer(tfs: TierFileSystem) -> None:
    """No network I/O or retry in a finalizer: a dropped ``ab`` file warns that its
    buffered bytes were not appended, at once, even with no daemon to answer."""
    import gc
    import time
    import warnings

    tfs.pipe_file("dropped", b"kept;")
    f = tfs.open("dropped", "ab")
    f.write(b"never appended")
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del f
        gc.collect()
    assert time.monotonic() - started < 1.0
    assert any(issubclass(w.category, ResourceWarning) and "not appended" in str(w.message) for w in caught)
    assert tfs.cat("dropped") == b"kept;"


def test_a_directory_url_with_a_trailing_slash_takes_writers_files(tfs: TierFileSystem) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.DataFrame({"n": [1, 2, 3], "v": ["a", "b", "c"]})
    frame.to_parquet("tierfs://trailing-pandas/", partition_cols=["n"])  # pandas' dataset writer
    pq.write_to_dataset(pa.table({"n": [4, 5]}), "trailing-arrow/", filesystem=tfs)
    assert sorted(pd.read_parquet("tierfs://trailing-pandas/")["v"]) == ["a", "b", "c"]
    assert sorted(pq.read_table("trailing-arrow/", filesystem=tfs)["n"].to_pylist()) == [4, 5]
    import dask.dataframe as dd

    for i in range(2):
        tfs.pipe_file(f"dcsv/{i}.csv", f"n,v\n{i},x{i}\n".encode())
    dd.read_csv("tierfs://dcsv/*.csv").to_parquet("tierfs://dout/")  # dask's writer, as typed
    assert sorted(dd.read_parquet("tierfs://dout/").compute()["v"]) == ["x0", "x1"]
    assert tfs._strip_protocol("tierfs://a/") == "a"
    with pytest.raises(Exception, match="invalid"):  # still refused, as by every front end
        tfs.info("a//")



def test_a_directory_is_not_read_as_empty_and_a_misspelled_option_is_refused(tfs: TierFileSystem) -> None:
    tfs.mkdir("a-directory")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        tfs.open("a-directory", "rb")
    with pytest.raises(IsADirectoryError):
        tfs.cat_file("a-directory")
    with pytest.raises(ValueError, match="'duarbility' \\(did you mean 'durability'\\?\\)"):
        TierFileSystem(duarbility="vd", skip_instance_cache=True)
