"""``TierFileSystem``: the fsspec plugin, protocol ``tierfs://``, talking to the daemon.

``fsspec.open("tierfs://logs/app.log")`` finds the local daemon with no configuration:
storage options ``url`` / ``data_dir`` / ``token`` override ``TIERFS_URL`` /
``TIERFS_DATA_DIR`` / ``TIERFS_TOKEN``, which override the default data dir's socket.

Semantics (append-only):
- ``rb``: reads through a 1 MiB block cache (fsspec's ``read.block_cache``), not the 5 MiB
  read-ahead over-fetch of fsspec's default; the daemon adds its own read-ahead.
- ``ab``: appends; every ``flush()`` (and every full 8 MiB buffer) is one atomic append,
  so concurrent writers never interleave inside a flush. A full buffer is sent without
  waiting for its answer, on the daemon's append socket, while the next one fills
  (``remote.append_pipeline``: the appends land in the order they were sent); an
  explicit ``flush()`` and ``close()`` return once every append sent has landed at the
  segment's durability level. Each lands exactly once, even when an answer is lost and
  it is sent again (``remote.exactly_once``). An append's error is raised by the
  ``write``, ``flush`` or ``close`` that reads its answer.
- ``wb`` / ``xb``: a new segment; over an existing non-empty segment both are an error
  (``FileExistsError``): segments are never overwritten. ``pipe_file`` likewise.
- Segments this instance creates (``ab``/``wb``/``xb`` of a new name, ``pipe_file``,
  ``cp_file``, ``touch``) get the storage option ``durability`` (``pd``, ``vd`` or
  ``tier2``; default: the daemon's ``durability``). On a ``tier2`` segment every
  ``flush()`` returns once its bytes are in tier-2 and committed.
- ``touch`` of an existing entry sets its atime/mtime to now, as ``touch`` on the
  mount does (never truncating); ``info()['mtime']`` (and ``ukey``) is the time of the
  last acknowledged append or explicit set, the same value every front end shows.
- ``mv`` onto an existing name replaces it (POSIX rename), never a sealed segment.
- Sizes come from the daemon on every call: the listings cache is off, so a growing
  segment's size is never stale.
- Flushed bytes are read straight from the chunk objects (``tierfs.remote.direct_read``: the
  daemon's chunk layout, then ``pread`` of local chunk files, or ranged reads of remote
  ones when ``chunk_storage_options`` are given), each 1 MiB block verified against its
  CRC32C; only the unflushed tail, and chunks that cannot be read directly, come through
  the daemon. ``direct_reads=False`` sends everything through the daemon.
- An open ``rb`` file reads the segment it opened: if the name comes to mean another
  segment (deleted and re-created, or renamed over), its reads fail rather than return
  the other segment's bytes (``FileNotFoundError``; the daemon part of a read is sent
  with ``If-Match`` on the opened segment's id). ``cat_file`` resolves the name on
  every call. On the mount, by contrast, an open descriptor keeps reading the segment
  it opened (the kernel holds its inode).
- A write whose answer was lost (the daemon restarting, a broken connection) is sent
  again with the same writer identity, so it lands once, for up to ``retry_budget_s``
  (default 15 s: a daemon's restart after a crash); then ``flush``/``close`` raise.
- Instances pickle by their constructor arguments (fsspec rebuilds them), so Spark
  workers get a working client in their own process.
"""

from __future__ import annotations

import datetime
import difflib
import io
import logging
import time
import warnings
from collections.abc import Iterator
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from tierfs.contracts import operations as ops
from tierfs.contracts.config import DURABILITY_LEVELS
from tierfs.contracts.errors import (
    ChunkUnavailable,
    InvalidArgumentError,
    SegmentExistsError,
    SegmentNotFoundError,
)
from tierfs.contracts.reports.info import DirectoryInfo, Info, SegmentInfo
from tierfs.remote.append_pipeline import AppendPipeline
from tierfs.remote.client import TierClient, discover_url
from tierfs.remote.direct_read import DirectChunkReader, SegmentLayout
from tierfs.remote.exactly_once import RETRY_BUDGET_S, BytesPayload, append_exactly_once

READ_BLOCK_BYTES = 1 << 20  # one block-cache block = one daemon block = one ranged GET
# Blocks an open file keeps. Few: a block fetched again costs a pread and a CRC check,
# while more blocks alive made sequential scans up to 35 % slower (memory traffic).
READ_CACHE_BLOCKS = 4
WRITE_BUFFER_BYTES = 8 << 20  # an append is sent at the latest when this much is buffered
LAYOUT_REFRESH_S = 1.0  # an open file asks for newly flushed chunks at most this often

log = logging.getLogger(__name__)


# The constructor's own options, and the ones fsspec's base class takes: any other key
# is a mistake (a misspelled "durability" silently ignored would create PD segments).
OWN_OPTIONS = ("url", "data_dir", "token", "direct_reads", "chunk_storage_options", "durability",
                  "retry_budget_s")
FSSPEC_OPTIONS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache",
                            "asynchronous", "loop"})


class TierFileSystem(AbstractFileSystem):
    protocol = "tierfs"
    root_marker = ""

    def __init__(
        self,
        url: str | None = None,
        data_dir: str | None = None,
        token: str | None = None,
        direct_reads: bool = True,
        chunk_storage_options: dict[str, Any] | None = None,
        durability: str | None = None,
        retry_budget_s: float = RETRY_BUDGET_S,
        **storage_options: Any,
    ) -> None:
        unknown = sorted(set(storage_options) - FSSPEC_OPTIONS)
        if unknown:  # a misspelled option would otherwise be ignored in silence
            known = [*OWN_OPTIONS, *sorted(FSSPEC_OPTIONS)]
            hints = [f"{key!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(key, known, 1))
                                  else "") for key in unknown]
            raise InvalidArgumentError(f"unknown tierfs storage option {', '.join(hints)}: it takes "
                                       f"{', '.join(OWN_OPTIONS)} and fsspec's {', '.join(sorted(FSSPEC_OPTIONS))}")
        if durability is not None and durability not in DURABILITY_LEVELS:
            raise InvalidArgumentError(
                f"durability must be one of {DURABILITY_LEVELS}, not {durability!r}"
            )
        storage_options.setdefault("use_listings_cache", False)
        super().__init__(
            url=url, data_dir=data_dir, token=token, direct_reads=direct_reads,
            chunk_storage_options=chunk_storage_options, durability=durability, retry_budget_s=retry_budget_s,
            **storage_options,
        )
        self.retry_budget_s = retry_budget_s
        self.durability = durability  # of the segments this instance creates (None: the daemon's)
        self.client = TierClient(url or discover_url(data_dir), token)
        self.direct = DirectChunkReader(chunk_storage_options) if direct_reads else None
        self.bytes_fetched_daemon = 0  # bytes this instance read through the daemon

    @property
    def bytes_fetched_direct(self) -> int:
        """Bytes this instance read from chunk objects (whole verified blocks)."""
        return self.direct.bytes_read if self.direct else 0

    @property
    def bytes_fetched(self) -> int:
        """Bytes this instance fetched, through the daemon and from chunk objects."""
        return self.bytes_fetched_daemon + self.bytes_fetched_direct

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("tierfs://"):
            path = path[len("tierfs://"):]
        # The name goes to the engine as given, as from every other front end: it
        # accepts one leading and one trailing '/' and refuses '//a', 'a//', '..'. The one
        # trailing '/' is dropped here, as fsspec's own filesystems do, because writers
        # (dask, pyarrow) join their file names to the stripped directory with a '/'.
        if path.endswith("/") and not path.endswith("//"):
            path = path[:-1]
        return path

    def unstrip_protocol(self, name: str) -> str:
        return f"tierfs://{name}"

    # ------------------------------------------------------------------ metadata
    @staticmethod
    def _entry(info: Info) -> dict[str, Any]:
        if isinstance(info, DirectoryInfo):
            return {"name": info.name, "size": 0, "type": "directory", "created": info.created,
                    "mtime": info.modified, "mode": info.mode, "uid": info.uid, "gid": info.gid}
        assert isinstance(info, SegmentInfo)
        return {
            "name": info.name,
            "size": info.length,
            "type": "file",
            "durable_length": info.durable_length,
            "appended_length": info.appended_length,
            "flushed_length": info.flushed_length,
            "sealed": info.sealed,
            "durability": info.durability,
            "chunk_count": info.chunk_count,
            "segment_id": info.segment_id,
            "created": info.created,
            "mtime": info.modified,
            "mode": info.mode,
            "uid": info.uid,
            "gid": info.gid,
        }

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._entry(self.client.stat(self._strip_protocol(path)))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        name = self._strip_protocol(path)
        try:  # a directory (what walk, find and glob list) in one request
            entries = self.client.ls(name)
        except NotADirectoryError:
            entries = [self.client.stat(name)]  # a file lists itself
        details = [self._entry(e) for e in entries]
        return details if detail else [d["name"] for d in details]

    def created(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["created"], datetime.UTC)

    def modified(self, path: str) -> datetime.datetime:
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(path)
        return datetime.datetime.fromtimestamp(info["mtime"], datetime.UTC)

    def chunk_layout(self, path: str) -> list[dict[str, Any]]:
        return self.client.layout(self._strip_protocol(path))

    # ------------------------------------------------------------------ data
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        name = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.info(name)["size"]
            start = size + start if start is not None and start < 0 else start
            end = size + end if end is not None and end < 0 else end
        start = max(0, start or 0)
        if self.direct is None:
            return self._read_daemon(name, start, end)
        return self._read_with_layout(name, self.segment_layout(name), start, end)

    def segment_layout(self, name: str) -> SegmentLayout:
        return SegmentLayout.from_json(self.client.layout(self._strip_protocol(name)))

    def _read_daemon(self, name: str, start: int, end: int | None, segment_id: int | None = None) -> bytes:
        """Bytes through the daemon; with ``segment_id``, only from that segment (a name
        deleted or replaced meanwhile is ``FileNotFoundError``, never another's bytes)."""
        data = self.client.read(name, start, end, segment_id=segment_id)
        self.bytes_fetched_daemon += len(data)
        return data

    def _read_with_layout(self, name: str, layout: SegmentLayout, start: int, end: int | None,
                          segment_id: int | None = None) -> bytes:
        """Bytes [start, end): the part the chunks hold directly, the rest via the daemon,
        from segment ``segment_id`` (default: the layout's, when it has chunks)."""
        assert self.direct is not None
        pieces = []
        direct_end = layout.flushed_end if end is None else min(end, layout.flushed_end)
        if direct_end > start:
            try:
                pieces.append(self.direct.read(layout, start, direct_end))
                start = direct_end
            except ChunkUnavailable as e:
                log.debug("reading tierfs://%s through the daemon: %s", name, e)
        if end is None or end > start:
            expected_id = layout.segment_id if segment_id is None else segment_id
            pieces.append(self._read_daemon(name, start, end, expected_id))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def pipe_file(self, path: str, value: bytes, mode: str = "create", **kwargs: Any) -> None:
        """Create a segment holding ``value``; a non-empty existing one is an error."""
        name = self._strip_protocol(path)
        self._create_for_write(name, exclusive=False)
        data = memoryview(bytes(value))
        appends = AppendPipeline(self.client, name, end=0, conditional=True, budget_s=self.retry_budget_s)
        try:
            for offset in range(0, len(data), WRITE_BUFFER_BYTES):
                appends.submit(data[offset : offset + WRITE_BUFFER_BYTES])
            appends.wait()
        finally:
            appends.close()

    def append(self, path: str, data: bytes, expected_offset: int | None = None) -> int:
        """One atomic append; returns its offset (create the segment first)."""
        return append_exactly_once(self.client, self._strip_protocol(path), BytesPayload(bytes(data)),
                                   expected_offset, conditional=expected_offset is not None,
                                   budget_s=self.retry_budget_s)

    def follow(self, path: str, offset: int = 0, poll_timeout_s: float = 30.0) -> Iterator[bytes]:
        """Yield new durable bytes as the segment grows (like ``tail -f``), forever."""
        return self.client.follow(self._strip_protocol(path), offset, poll_timeout_s)

    def _create_for_write(self, name: str, exclusive: bool) -> None:
        try:
            self.client.create(name, self.durability, parents=True)
        except SegmentExistsError:
            info = self.client.stat(name)
            if exclusive or not isinstance(info, SegmentInfo) or info.appended_length > 0:
                raise FileExistsError(
                    f"tierfs://{name} exists; segments are append-only and never overwritten. To "
                    "append, open it with 'ab' on tierfs:// itself: caching layers (simplecache::, "
                    "filecache::) upload a whole file when it closes, which would overwrite it"
                ) from None

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TierFile:
        name = self._strip_protocol(path)
        if mode == "rb":  # the file needs the details anyway: taken once, and a directory refused
            kwargs["details"] = self.info(name)
            if kwargs["details"]["type"] == "directory":
                raise IsADirectoryError(f"tierfs://{name} is a directory: open a segment in it (fs.ls lists them)")
        if mode in ("wb", "xb"):
            self._create_for_write(name, exclusive=mode == "xb")
        elif mode == "ab":
            try:
                self.client.create(name, self.durability, parents=True)
            except SegmentExistsError:
                pass
        elif mode != "rb":
            raise ValueError(f"tierfs supports modes rb, ab, wb, xb, not {mode!r}")
        cache_type = kwargs.pop("cache_type", "blockcache")
        if cache_type == "blockcache":
            cache_options = {"maxblocks": READ_CACHE_BLOCKS, **(cache_options or {})}
        return TierFile(
            self, name, mode,
            block_size=block_size or (READ_BLOCK_BYTES if mode == "rb" else WRITE_BUFFER_BYTES),
            cache_type=cache_type,
            cache_options=cache_options,
            **kwargs,
        )

    # ------------------------------------------------------------------ namespace
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        name = self._strip_protocol(path)
        if self.exists(name):
            raise FileExistsError(f"tierfs://{name} exists")
        self.client.op("mkdir", path=name, parents=create_parents)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        name = self._strip_protocol(path)
        if self.exists(name):
            if exist_ok and self.isdir(name):
                return
            raise FileExistsError(f"tierfs://{name} exists")
        self.client.op("mkdir", path=name, parents=True, exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.client.op("rmdir", path=self._strip_protocol(path))

    def rm_file(self, path: str) -> None:
        self.client.delete(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        name = self._strip_protocol(path)
        if self.isdir(name):
            self.rmdir(name)
        else:
            self.rm_file(name)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        for name in sorted(paths, key=lambda p: (-p.count("/"), p)):  # children first
            self._rm(name)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """Rename (metadata only, directories with everything below them)."""
        source, target = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(target):
            target = f"{target}/{source.rpartition('/')[2]}"
        self.client.op("mv", source=source, target=target)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        source, target = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(source):
            self.makedirs(target, exist_ok=True)
            return
        self._create_for_write(target, exclusive=False)
        appends = AppendPipeline(self.client, target, end=0, conditional=True, budget_s=self.retry_budget_s)
        try:
            offset = 0
            while data := self.cat_file(source, offset, offset + WRITE_BUFFER_BYTES):
                appends.submit(data)  # sent while the next piece is read
                offset += len(data)
            appends.wait()
        finally:
            appends.close()

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        name = self._strip_protocol(path)
        try:
            info = self.client.stat(name)
        except SegmentNotFoundError:
            self.client.create(name, self.durability, parents=True)
            return
        # as the mount's touch: the times move, no byte changes (segments are never
        # truncated, so truncate=True of an existing segment is this too)
        stamp_ns = time.time_ns()
        self.client.call(ops.SET_ATTRIBUTES, info.name, atime_ns=stamp_ns, mtime_ns=stamp_ns)

    def ukey(self, path: str) -> str:
        info = self.info(path)
        return f"{info['name']}:{info['size']}:{info.get('mtime')}"


class TierFile(AbstractBufferedFile):
    """A tierfs segment opened through fsspec (see the module docstring for modes)."""

    fs: TierFileSystem
    offset: int | None
    buffer: io.BytesIO

    _layout: SegmentLayout | None = None

    def __init__(self, *args: Any, details: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._details = details  # what fsspec would fetch with a second info()
        super().__init__(*args, **kwargs)
    _appends: AppendPipeline | None = None  # this file's appends (write modes), once one is sent
    _layout_time_s = 0.0

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs = self.fs
        if fs.direct is None:
            return fs._read_daemon(self.path, start, end, self.details.get("segment_id"))
        layout = self._layout
        stale = layout is None or (
            end > layout.flushed_end and layout.flushed_end < self.size
            and time.monotonic() - self._layout_time_s >= LAYOUT_REFRESH_S
        )
        if stale:
            layout = fs.segment_layout(self.path)
            opened_id = self.details.get("segment_id")
            if layout.segment_id is not None and layout.segment_id != opened_id:
                raise FileNotFoundError(
                    f"tierfs://{self.path} was deleted or replaced since it was opened"
                )
            self._layout, self._layout_time_s = layout, time.monotonic()
        assert layout is not None
        return fs._read_with_layout(self.path, layout, start, end, self.details.get("segment_id"))

    def _initiate_upload(self) -> None:
        """Nothing to do: ``_open`` created the segment."""

    def write(self, data: Any) -> int:
        """Buffer ``data``; a full buffer is sent as one append without waiting for its
        answer (``flush`` waits for every append sent)."""
        if not self.writable():
            raise ValueError("File not in write mode")
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        written = self.buffer.write(data)
        self.loc += written
        if self.buffer.tell() >= self.blocksize:
            self._send_buffer()
        return written

    def _send_buffer(self) -> None:
        """The buffer as one append, sent at the end of the segment as this file last
        saw it (a concurrent writer's append moves it on), after every append this
        file sent before; it lands exactly once (``AppendPipeline``)."""
        size = self.buffer.tell()
        if not size:
            return
        if self._appends is None:
            self._appends = AppendPipeline(self.fs.client, self.path, budget_s=self.fs.retry_budget_s)
        self._appends.submit(self.buffer.getbuffer())  # held, not copied, until its answer
        self.offset = (self.offset or 0) + size
        self.buffer = io.BytesIO()

    def _upload_chunk(self, final: bool = False) -> bool:
        """The buffer as one append, landed when this returns."""
        self._send_buffer()
        if self._appends is not None:
            self._appends.wait()
        return True

    def flush(self, force: bool = False) -> None:
        """Send everything written since the last flush as one atomic append, and
        return once every append of this file has landed (at the segment's durability
        level)."""
        if self.closed:
            raise ValueError("flush on a closed file")
        if self.mode == "rb":
            return
        self._upload_chunk(final=force)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._appends is not None:
                self._appends.close()

    def __del__(self) -> None:
        """A file dropped without ``close``: no network I/O in a finalizer (it may run
        at any moment, in any thread, at interpreter exit), so what was not flushed is
        not appended, and said so."""
        if getattr(self, "closed", True):
            return
        unsent = self.buffer.tell() if self.mode != "rb" and getattr(self, "buffer", None) is not None else 0
        pending = self._appends is not None and self._appends.busy
        self.closed = True
        if self._appends is not None:
            self._appends.close()
        if unsent or pending:
            warnings.warn(f"tierfs://{self.path} was dropped without close(): {unsent} buffered bytes were not "
                          "appended (and appends in flight may or may not have landed); close files, or use "
                          "`with fs.open(...)`", ResourceWarning, stacklevel=2)
