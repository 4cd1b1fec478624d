"""The PySpark data source ``tierfs`` (Python Data Source API, PySpark >= 4.0): batch reads.

    from tierfs.spark_source import TierDataSource
    spark.dataSource.register(TierDataSource)
    spark.read.format("tierfs").load("tierfs://logs/")                    # lines
    spark.read.format("tierfs").option("format", "json").schema("path string, offset long, user string, n long").load("tierfs://events/")
    spark.read.format("tierfs").option("format", "raw").option("block_size", 65536).load("tierfs://blobs/b1")

Options: ``path`` (a segment or a directory, every segment below it), ``format``
(``lines`` default, ``json``, ``raw``), ``block_size`` (raw rows, default 1 MiB),
``partition_bytes`` (target partition size, default 64 MiB), ``url`` / ``data_dir`` /
``token`` (how to reach the daemon; default ``TIERFS_URL`` / ``TIERFS_DATA_DIR``) and
``chunk_storage_options`` (JSON: fsspec options that let executors read S3 chunks
directly). Every row has ``path`` and ``offset`` (the record's first byte) columns:
``lines`` and ``json`` give one row per newline-terminated record (the last one may lack
its newline), ``raw`` one row per ``block_size`` bytes.

Invariants:
- The driver takes one snapshot per segment (durable length and chunk layout) and
  plans partitions from the chunk layout: chunks are merged up to ``partition_bytes``
  and larger ones split at that size; small segments share a partition.
- A record belongs to the partition its first byte is in: a partition skips a record
  that began before it and finishes the one that crosses its end, so each record is
  read exactly once whatever the boundaries (chunks, partitions, the tail).
- Executors read flushed bytes straight from chunk objects (``DirectChunkReader``, every
  block CRC-checked) and only the rest, or chunks they cannot open, through the daemon.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .client import TierClient, discover_url
from .direct_read import ChunkUnavailable, DirectChunkReader, SegmentLayout
from .errors import InvalidArgumentError
from .store import SegmentInfo

MiB = 1 << 20
DEFAULT_PARTITION_BYTES = 64 * MiB
READ_PIECE_BYTES = 4 * MiB
FORMATS = ("lines", "json", "raw")
DEFAULT_SCHEMAS = {
    "lines": "path string, offset long, value string",
    "raw": "path string, offset long, value binary",
}


@dataclasses.dataclass(frozen=True)
class SegmentRange:
    """Records starting in ``[start, end)`` of one segment snapshot."""

    path: str
    length: int  # the snapshot's durable length: nothing past it is read
    start: int
    end: int
    layout: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class TierPartition(InputPartition):
    ranges: tuple[SegmentRange, ...]


def _strip(path: str) -> str:
    return path[len("tierfs://"):] if path.startswith("tierfs://") else path


def plan_ranges(path: str, length: int, layout: list[dict[str, Any]], target_bytes: int) -> list[SegmentRange]:
    """Split one segment snapshot into ranges of about ``target_bytes`` along chunk
    boundaries (chunks merged while they fit, large ones cut at the target size)."""
    bounds = [0]
    for chunk in layout:
        start, end = int(chunk["start"]), min(int(chunk["end"]), length)
        position = start
        while end - position > target_bytes:
            position += target_bytes
            bounds.append(position)
        bounds.append(end)
    if bounds[-1] < length:
        bounds.append(length)
    merged = [bounds[0]]  # consecutive pieces joined while they stay within the target
    previous = bounds[0]
    for bound in bounds[1:]:
        if bound - merged[-1] > target_bytes and previous > merged[-1]:
            merged.append(previous)
        previous = bound
    if merged[-1] != bounds[-1] or len(merged) == 1:
        merged.append(bounds[-1])
    if layout and int(layout[0]["start"]) > 0:  # retention deleted the head
        merged[0] = int(layout[0]["start"])
    return [SegmentRange(path, length, lo, hi, layout) for lo, hi in zip(merged, merged[1:], strict=False) if hi > lo]


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


class SegmentBytes:
    """Bytes of one segment snapshot: chunks directly where possible, else the daemon."""

    def __init__(self, client: TierClient, direct: DirectChunkReader, item: SegmentRange) -> None:
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


def iter_lines(source: SegmentBytes, item: SegmentRange) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of every line that starts in the range."""
    position = item.start
    if position > 0 and source.read(position - 1, position) != b"\n":
        # the line in progress at ``start`` belongs to the previous range: skip it
        while True:
            piece = source.read(position, position + READ_PIECE_BYTES)
            if not piece:
                return
            newline = piece.find(b"\n")
            if newline >= 0:
                position += newline + 1
                break
            position += len(piece)
    buffer = b""
    buffer_start = position
    while buffer_start < item.end:
        piece = source.read(buffer_start + len(buffer), buffer_start + len(buffer) + READ_PIECE_BYTES)
        if not piece:
            if buffer:
                yield buffer_start, buffer  # the last record, without a newline
            return
        buffer += piece
        while buffer_start < item.end:
            newline = buffer.find(b"\n")
            if newline < 0:
                break
            yield buffer_start, buffer[:newline]
            buffer = buffer[newline + 1 :]
            buffer_start += newline + 1


class TierReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.format = options.get("format", "lines")
        if self.format not in FORMATS:
            raise InvalidArgumentError(f"format must be one of {FORMATS}, not {self.format!r}")
        self.block_size = int(options.get("block_size", MiB))
        self.partition_bytes = int(options.get("partition_bytes", DEFAULT_PARTITION_BYTES))
        if self.block_size < 1 or self.partition_bytes < 1:
            raise InvalidArgumentError("block_size and partition_bytes must be >= 1")

    def _client(self) -> TierClient:
        url = self.options.get("url") or discover_url(self.options.get("data_dir") or None)
        return TierClient(url, self.options.get("token"))

    def partitions(self) -> list[TierPartition]:
        path = _strip(self.options.get("path", ""))
        client = self._client()
        try:
            info = client.stat(path)
            segments = [info] if isinstance(info, SegmentInfo) else _walk(client, path)
            ranges: list[SegmentRange] = []
            for segment in segments:
                layout = client.layout(segment.name)
                ranges += plan_ranges(segment.name, segment.length, layout, self.partition_bytes)
        finally:
            client.close()
        return plan_partitions(ranges, self.partition_bytes)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TierPartition)
        client = self._client()
        storage_options = self.options.get("chunk_storage_options")
        direct = DirectChunkReader(json.loads(storage_options) if storage_options else None)
        names = self.schema.fieldNames()
        try:
            for item in partition.ranges:
                source = SegmentBytes(client, direct, item)
                if self.format == "raw":  # blocks aligned to the segment start
                    offset = -(-item.start // self.block_size) * self.block_size
                    while offset < item.end:
                        yield (item.path, offset, source.read(offset, offset + self.block_size))
                        offset += self.block_size
                    continue
                for offset, line in iter_lines(source, item):
                    if self.format == "lines":
                        yield (item.path, offset, line.decode("utf-8", "replace"))
                    else:
                        record = json.loads(line) if line.strip() else {}
                        values = {**record, "path": item.path, "offset": offset}
                        yield tuple(values.get(name) for name in names)
        finally:
            client.close()


def _walk(client: TierClient, directory: str) -> list[SegmentInfo]:
    found: list[SegmentInfo] = []
    for entry in client.ls(directory):
        if isinstance(entry, SegmentInfo):
            found.append(entry)
        else:
            found += _walk(client, entry.name)
    return found


class TierDataSource(DataSource):
    """``spark.read.format("tierfs")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "tierfs"

    def schema(self) -> str:
        form = self.options.get("format", "lines")
        if form == "json":
            raise InvalidArgumentError("format json needs a schema: .schema('path string, offset long, ...')")
        return DEFAULT_SCHEMAS.get(form, DEFAULT_SCHEMAS["lines"])

    def reader(self, schema: StructType) -> TierReader:
        return TierReader(dict(self.options), schema)


def register(spark: Any) -> None:
    """Make ``format("tierfs")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(TierDataSource)

