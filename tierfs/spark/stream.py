"""Streaming reads: ``spark.readStream.format("tierfs").load("tierfs://logs/")``.

An offset is a JSON object ``{"<segment id>": {"path": name, "offset": n}}``: for each
segment, the end of the records already handed to Spark. Segments are keyed by id, so
a rename is not mistaken for a new segment. Option ``starting`` is ``earliest``
(default: every segment from its first readable byte) or ``latest``.

Invariants:
- An offset never exceeds the segment's durable length, so a micro-batch never holds
  bytes a crash can take away, and re-running a batch from the checkpoint reads the
  same records again.
- Offsets are record-aligned: cut back to the last newline (``lines``/``json``) or the
  last whole block (``raw``) unless the segment is sealed, so every record lands in
  exactly one batch and none is split.
- New segments under the directory start at their first readable byte; a segment that
  disappears drops out; bytes that retention deleted before they were read are
  skipped (they no longer exist).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from tierfs.contracts.errors import InvalidArgumentError, SegmentNotFoundError
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.remote.client import TierClient
from tierfs.spark.hook_errors import tierfs_errors
from tierfs.spark.read import (
    ReadOptions,
    check_schema,
    plan_partitions,
    plan_ranges,
    read_partition,
    walk_segments,
)

log = logging.getLogger(__name__)

NEWLINE_SEARCH_PIECE_BYTES = 64 << 10
STARTING = ("earliest", "latest")


@tierfs_errors
class TierStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = ReadOptions.parse(options)
        self.schema = schema
        check_schema(self.options, schema)
        self.starting = options.get("starting", "earliest")
        if self.starting not in STARTING:
            raise InvalidArgumentError(f"starting must be one of {STARTING}, not {self.starting!r}")
        self._handed_out: dict[str, int] = {}  # id -> last offset given; bounds the newline search

    def initialOffset(self) -> dict[str, Any]:
        return self.latestOffset() if self.starting == "latest" else {}

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """Every segment's record-aligned durable length. PySpark >= 4.2 passes the batch's
        ``start`` (and a read limit: tierfs sets none, so it is always "all available");
        4.0 and 4.1 call it without arguments."""
        for key, entry in (start or {}).items():  # after a restart: search from there
            self._handed_out.setdefault(key, int(entry["offset"]))
        client = self.options.client()
        try:
            offsets: dict[str, Any] = {}
            for segment in walk_segments(client, self.options.path):
                key = str(segment.segment_id)
                floor = max(self._handed_out.get(key, segment.start_offset), segment.start_offset)
                end = self._record_aligned_end(client, segment, floor)
                if end > segment.start_offset or key in self._handed_out:
                    offsets[key] = {"path": segment.name, "offset": end}
                    self._handed_out[key] = end
            return offsets
        finally:
            client.close()

    def _record_aligned_end(self, client: TierClient, segment: SegmentInfo, floor: int) -> int:
        """The durable length cut back to a record boundary, never below ``floor``."""
        length = segment.length
        if segment.sealed or length <= floor:
            return max(length, floor)
        if self.options.format == "raw":
            return max(floor, length - length % self.options.block_size)
        position = length
        while position > floor:
            low = max(floor, position - NEWLINE_SEARCH_PIECE_BYTES)
            newline = client.read(segment.name, low, position).rfind(b"\n")
            if newline >= 0:
                return low + newline + 1
            position = low
        return floor

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
        client = self.options.client()
        try:
            ranges = []
            for key, entry in end.items():
                stop = int(entry["offset"])
                begin = int(start.get(key, {}).get("offset", 0))
                if stop <= begin:
                    continue
                try:
                    info = client.stat(entry["path"])
                    layout = client.layout(entry["path"])
                except SegmentNotFoundError:
                    log.warning("tierfs stream: %s is gone; bytes %d..%d skipped", entry["path"], begin, stop)
                    continue
                if not isinstance(info, SegmentInfo) or str(info.segment_id) != key:
                    log.warning("tierfs stream: %s is no longer segment %s; bytes %d..%d skipped",
                                entry["path"], key, begin, stop)
                    continue
                begin = max(begin, info.start_offset)
                ranges += plan_ranges(info.name, layout, begin, stop, self.options.partition_bytes,
                                      info.start_offset)
            return plan_partitions(ranges, self.options.partition_bytes)
        finally:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches of the partition (tuples for a schema they cannot build)."""
        return read_partition(self.options, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        for key, entry in end.items():  # after a restart: newline searches start here
            self._handed_out[key] = max(self._handed_out.get(key, 0), int(entry["offset"]))
