"""Reading side of the Spark data source: plan partitions from chunk layouts, and turn
segment bytes into rows (shared by batch and streaming reads): Arrow record batches
(``batches``) built from blocks of whole records (``records``), or, for a schema the
batches cannot build, one tuple per record (``tuple_rows``, the reference semantics).

Invariants:
- A partition covers ranges ``[start, end)`` of segment snapshots; ``length`` of a
  snapshot bounds every read, so nothing past it is ever returned.
- Ranges follow the chunk layout: chunks are merged up to ``partition_bytes`` and
  larger ones split at that size; small segments share a partition.
- A record belongs to the range its first byte is in: a range skips a record that began
  before it and finishes the one that crosses its end, so each record is read exactly
  once whatever the boundaries (chunks, partitions, micro-batches, the tail).
- Executors read flushed bytes straight from chunk objects (``DirectChunkReader``, every
  block CRC-checked; offloaded chunks from the long-term store when
  ``chunk_storage_options`` are given) and only the rest, or chunks they cannot open,
  through the daemon.
- Executors fetch the next piece (``READ_PIECE_BYTES``) of a range while Spark consumes
  the rows of the current one; at most one piece is in flight per partition
  (``RAW_PIECES_AHEAD`` for raw blocks), so a partition holds at most that many pieces
  plus the current one, and, for lines and JSON, the ``parse_threads`` blocks being
  parsed at once.
- Directory walks skip names that start with ``_`` or ``.``, as Spark's file sources
  do: that is where writers keep their transaction segments.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from tierfs.contracts.errors import ChunkUnavailable, InvalidArgumentError
from tierfs.contracts.names import basename
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.remote.client import TierClient, discover_url
from tierfs.remote.direct_read import DirectChunkReader, SegmentLayout
from tierfs.spark.batches import OFFSET, PATH, BatchShape, line_batches, raw_batches, record_columns
from tierfs.spark.json_columns import json_record
from tierfs.spark.records import record_blocks, split_lines
from tierfs.spark.worker_gc import freeze_imports

MiB = 1 << 20
DEFAULT_PARTITION_BYTES = 64 * MiB
READ_PIECE_BYTES = 4 * MiB
# Raw reads keep two pieces in flight: the worker does nothing but wait for them (no
# parsing), and the next GET then starts while the previous one's body is still
# arriving, not after the worker has taken it. Lines and JSON parse each piece, which
# takes longer than fetching the next one: one ahead keeps them busy.
RAW_PIECES_AHEAD = 2
FORMATS = ("lines", "json", "raw")
MAX_BLOCK_SIZE = (1 << 31) - 1  # a raw row is one Arrow binary value (32-bit offsets)
# The most blocks of lines a partition may split and parse at once (option
# ``parse_threads``, default 1: Spark already runs a task per executor core; more pays
# only where a core would otherwise idle, fewer tasks than cores: docs/PERFORMANCE.md).
MAX_PARSE_THREADS = 16
_Row = TypeVar("_Row")


@dataclasses.dataclass(frozen=True)
class SegmentRange:
    """Records starting in ``[start, end)`` of one segment snapshot."""

    path: str
    length: int  # the snapshot's readable length: nothing past it is read
    start: int
    end: int
    layout: list[dict[str, Any]]
    first: int = 0  # the segment's first readable byte (retention deleted those below)


@dataclasses.dataclass(frozen=True)
class TierPartition(InputPartition):
    ranges: tuple[SegmentRange, ...]


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """The options every reader understands, validated once on the driver."""

    path: str
    format: str
    block_size: int
    partition_bytes: int
    url: str | None
    data_dir: str | None
    token: str | None
    chunk_storage_options: dict[str, Any] | None
    parse_threads: int = 1

    @classmethod
    def parse(cls, options: dict[str, str]) -> ReadOptions:
        form = options.get("format", "lines")
        if form not in FORMATS:
            raise InvalidArgumentError(f"format must be one of {FORMATS}, not {form!r}")
        block_size = _int_option(options, "block_size", MiB)
        partition_bytes = _int_option(options, "partition_bytes", DEFAULT_PARTITION_BYTES)
        parse_threads = _int_option(options, "parse_threads", 1)
        try:
            storage = options.get("chunk_storage_options")
            storage_options = json.loads(storage) if storage else None
        except ValueError as e:
            raise InvalidArgumentError(f"tierfs read option chunk_storage_options is not JSON: {e}") from None
        if block_size < 1 or partition_bytes < 1:
            raise InvalidArgumentError("block_size and partition_bytes must be >= 1")
        if not 1 <= parse_threads <= MAX_PARSE_THREADS:
            raise InvalidArgumentError(f"parse_threads must be between 1 and {MAX_PARSE_THREADS}, "
                                       f"not {parse_threads}")
        if block_size > MAX_BLOCK_SIZE:
            raise InvalidArgumentError(f"block_size must be <= {MAX_BLOCK_SIZE} (one Spark binary value)")
        return cls(strip_scheme(options.get("path", "")), form, block_size, partition_bytes,
                   options.get("url"), options.get("data_dir"), options.get("token"), storage_options,
                   parse_threads)

    def client(self) -> TierClient:
        return TierClient(self.url or discover_url(self.data_dir or None), self.token)


def _int_option(options: dict[str, str], name: str, default: int) -> int:
    try:
        return int(options.get(name, default))
    except ValueError:
        raise InvalidArgumentError(f"tierfs read option {name} must be an integer, not {options[name]!r}") from None


def strip_scheme(path: str) -> str:
    return path[len("tierfs://"):] if path.startswith("tierfs://") else path


def walk_segments(client: TierClient, path: str) -> list[SegmentInfo]:
    """The segment at ``path``, or every segment below the directory ``path``."""
    info = client.stat(path)
    if isinstance(info, SegmentInfo):
        return [info]
    found: list[SegmentInfo] = []
    for entry in client.ls(path):
        if basename(entry.name).startswith(("_", ".")):
            continue
        found += [entry] if isinstance(entry, SegmentInfo) else walk_segments(client, entry.name)
    return found


def plan_ranges(path: str, layout: list[dict[str, Any]], start: int, end: int,
                target_bytes: int, first: int = 0) -> list[SegmentRange]:
    """Split ``[start, end)`` of one segment snapshot into ranges of about
    ``target_bytes`` along chunk boundaries (chunks merged while they fit, large ones
    cut at the target size)."""
    bounds = [start]
    for chunk in layout:
        low, high = max(int(chunk["start"]), start), min(int(chunk["end"]), end)
        if high <= low:
            continue
        position = low
        while high - position > target_bytes:
            position += target_bytes
            bounds.append(position)
        bounds.append(high)
    if bounds[-1] < end:
        bounds.append(end)
    merged = [bounds[0]]  # consecutive pieces joined while they stay within the target
    previous = bounds[0]
    for bound in bounds[1:]:
        if bound - merged[-1] > target_bytes and previous > merged[-1]:
            merged.append(previous)
        previous = bound
    if merged[-1] != bounds[-1] or len(merged) == 1:
        merged.append(bounds[-1])
    return [SegmentRange(path, end, low, high, layout, first)
            for low, high in zip(merged, merged[1:], strict=False) if high > low]


def plan_partitions(ranges: list[SegmentRange], target_bytes: int) -> list[TierPartition]:
    """Group ranges into partitions of about ``target_bytes`` (small segments share one)."""
    partitions: list[TierPartition] = []
    group: list[SegmentRange] = []
    size = 0
    for item in ranges:
        if group and size + (item.end - item.start) > target_bytes:
            partitions.append(TierPartition(tuple(group)))
            group, size = [], 0
        group.append(item)
        size += item.end - item.start
    if group:
        partitions.append(TierPartition(tuple(group)))
    return partitions


class DaemonReads:
    """A partition's reads through the daemon, its client opened on first use: ranges
    whose bytes are all in chunk objects never pay for it (a client and its connection
    to the daemon; an https:// daemon's client also loads the CA bundle, tens of ms)."""

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._client: TierClient | None = None
        self._lock = threading.Lock()  # read-ahead threads of consecutive ranges may overlap

    def read(self, path: str, start: int, end: int) -> bytes:
        with self._lock:
            if self._client is None:
                self._client = self._options.client()
            client = self._client
        return client.read(path, start, end)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class SegmentBytes:
    """Bytes of one segment snapshot: chunks directly where possible, else the daemon."""

    def __init__(self, client: DaemonReads, direct: DirectChunkReader, item: SegmentRange) -> None:
        self._client = client
        self._direct = direct
        self._path = item.path
        self._length = item.length
        self._layout = SegmentLayout.from_json(item.layout)

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self._length)
        if end <= start:
            return b""
        flushed = min(end, self._layout.flushed_end)
        pieces = []
        if start < flushed:
            try:
                pieces.append(self._direct.read(self._layout, start, flushed))
            except ChunkUnavailable:
                pieces.append(self._client.read(self._path, start, flushed))
            start = flushed
        if start < end:
            pieces.append(self._client.read(self._path, start, end))
        return b"".join(pieces)

    def pieces(self, start: int, piece_bytes: int, ahead: int = 1,
               stop: int | None = None) -> Generator[tuple[int, bytes], None, None]:
        """(offset, bytes) of consecutive pieces from ``start`` to the snapshot's end (or
        to ``stop``, if before it: nothing past it is read); the next ``ahead`` pieces are
        fetched while the caller works on the current one (a short piece restarts the
        read-ahead after it)."""
        limit = self._length if stop is None else min(stop, self._length)
        pending: collections.deque[tuple[int, int, Future[bytes]]] = collections.deque()
        submitted = start
        with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="tierfs-readahead") as pool:

            def fill() -> None:
                nonlocal submitted
                while len(pending) < ahead and submitted < limit:
                    end = min(submitted + piece_bytes, limit)
                    pending.append((submitted, end, pool.submit(self.read, submitted, end)))
                    submitted = end

            try:
                fill()
                while pending:
                    piece_start, piece_end, future = pending.popleft()
                    piece = future.result()
                    if not piece:
                        return
                    if len(piece) != piece_end - piece_start:
                        for _, _, later in pending:
                            later.cancel()
                        pending.clear()
                        submitted = piece_start + len(piece)
                    fill()
                    yield piece_start, piece
            finally:
                for _, _, later in pending:  # the caller stopped early: drop what has not started
                    later.cancel()


def iter_record_blocks(source: SegmentBytes, item: SegmentRange) -> Iterator[tuple[int, bytes]]:
    """(offset, block of whole records) of the records that start in the range."""
    # Past the segment's first byte, records of this range begin after the first newline
    # at or after ``start - 1``: a line in progress at ``start`` belongs to the range before.
    skip = item.start > item.first
    stream = source.pieces(item.start - 1 if skip else item.start, READ_PIECE_BYTES)
    try:
        yield from record_blocks(stream, item.end, skip_first=skip)
    finally:
        stream.close()


def iter_lines(source: SegmentBytes, item: SegmentRange) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of every line that starts in the range."""
    skip = item.start > item.first
    stream = source.pieces(item.start - 1 if skip else item.start, READ_PIECE_BYTES)
    try:
        yield from split_lines(stream, item.end, skip_first=skip)
    finally:
        stream.close()


def iter_block_pieces(source: SegmentBytes, item: SegmentRange, block_size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of consecutive pieces of whole ``block_size`` blocks, holding
    every block that starts in the range; blocks are aligned to multiples of
    ``block_size``, except a first one cut by retention (a piece of its own)."""
    first = item.start if item.start == item.first else -(-item.start // block_size) * block_size
    if first % block_size:  # a retention cut: the first block ends at the next multiple
        cut = min(first - first % block_size + block_size, item.length)
        yield first, source.read(first, cut)
        first = cut
    piece_bytes = max(1, READ_PIECE_BYTES // block_size) * block_size
    blocks_end = -(-item.end // block_size) * block_size  # the last block starting in the range ends here
    stream = source.pieces(first, piece_bytes, RAW_PIECES_AHEAD, stop=blocks_end)
    try:
        for piece_start, piece in stream:
            if piece_start >= item.end:
                return
            blocks = -(-(item.end - piece_start) // block_size)  # those starting before the end
            yield piece_start, piece[: blocks * block_size] if blocks * block_size < len(piece) else piece
    finally:
        stream.close()


def iter_blocks(source: SegmentBytes, item: SegmentRange, block_size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of every ``block_size`` block that starts in the range."""
    for piece_start, piece in iter_block_pieces(source, item, block_size):
        for offset in range(0, len(piece), block_size):
            yield piece_start + offset, piece[offset : offset + block_size]


def tuple_rows(options: ReadOptions, schema: StructType, item: SegmentRange,
               source: SegmentBytes) -> Iterator[tuple[Any, ...]]:
    """The rows of one range as tuples, one record at a time: the reference the Arrow
    batches follow, and the path of schemas they cannot build (``BatchShape.of``)."""
    if options.format != "json":
        columns = record_columns(options.format, schema)
        records = (iter_blocks(source, item, options.block_size) if options.format == "raw" else
                   ((offset, line.decode("utf-8", "replace")) for offset, line in iter_lines(source, item)))
        for offset, value in records:
            yield tuple(item.path if c == PATH else offset if c == OFFSET else value for c in columns)
        return
    names = schema.fieldNames()
    for offset, line in iter_lines(source, item):
        values = {**json_record(item.path, offset, line), "path": item.path, "offset": offset}
        yield tuple(values.get(name) for name in names)


def check_schema(options: ReadOptions, schema: StructType) -> None:
    """Refuse on the driver, when the query is planned, a schema no row could fill."""
    if options.format != "json":
        record_columns(options.format, schema)


def read_partition(options: ReadOptions, schema: StructType,
                   partition: InputPartition) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """The rows of one partition (runs on an executor): Arrow record batches, or tuples
    for a schema the batches cannot build."""
    assert isinstance(partition, TierPartition)
    freeze_imports()
    shape = BatchShape.of(options.format, schema)
    if shape is None:
        return _rows(options, partition, lambda item, source: tuple_rows(options, schema, item, source))
    if options.format == "raw":
        return _rows(options, partition, lambda item, source: raw_batches(
            shape, item.path, iter_block_pieces(source, item, options.block_size), options.block_size))
    return _rows(options, partition, lambda item, source: line_batches(
        shape, item.path, iter_record_blocks(source, item), options.parse_threads))


def _rows(options: ReadOptions, partition: TierPartition,
          rows_of: Callable[[SegmentRange, SegmentBytes], Iterator[_Row]]) -> Iterator[_Row]:
    """``rows_of`` every range of the partition, with one daemon client for them all."""
    client = DaemonReads(options)
    direct = DirectChunkReader(options.chunk_storage_options)
    try:
        for item in partition.ranges:
            yield from rows_of(item, SegmentBytes(client, direct, item))
    finally:
        client.close()
