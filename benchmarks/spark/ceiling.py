"""The ceilings of Spark's Python data source path on this machine, with no I/O: a source
yielding the same Arrow batch again and again with the schema of the tierfs read it
stands next to (``MemorySource``: ``raw``, four 1 MiB rows; ``lines`` or ``json``, the
rows of a sample of the events file), and a sink taking the Arrow batches Spark hands a
``DataSourceArrowWriter`` and discarding them, or first encoding each with the tierfs
writer's ``BatchEncoder`` (``ArrowDiscardSink``). The only module importing pyspark at
its top."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

MiB = 1 << 20
RAW_BATCH_ROWS = 4  # a 4 MiB read piece of 1 MiB blocks


class MemoryPartition(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class MemoryReader(DataSourceReader):
    """Yields one Arrow batch again and again: what moving the rows of a batch into the
    JVM costs, with no I/O and no parsing in the timed part (the batch is built once per
    partition, for ``json`` by pyarrow's JSON reader)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.sample, self.form, self.schema = options.get("sample", ""), options["format"], schema
        self.rows, self.count = int(options["rows"]), int(options["partitions"])

    def partitions(self) -> list[MemoryPartition]:
        share = -(-self.rows // self.count)
        return [MemoryPartition(min(share, self.rows - start)) for start in range(0, self.rows, share)]

    def _batch(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pa_json
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        if self.form == "raw":
            columns = [pa.repeat("memory", RAW_BATCH_ROWS), pa.array([i * MiB for i in range(RAW_BATCH_ROWS)], pa.int64()),
                       pa.array([os.urandom(MiB)] * RAW_BATCH_ROWS, pa.binary())]
            return pa.RecordBatch.from_arrays(columns, schema=target)
        with open(self.sample, "rb") as file:
            data = file.read()
        lines = pc.split_pattern(pa.array([data.rstrip(b"\n")], pa.binary()), "\n").flatten()
        offsets = pc.cumulative_sum(pc.add(pc.binary_length(lines).cast(pa.int64()), 1))
        found: dict[str, Any] = {"path": pa.repeat("memory", len(lines)), "offset": offsets}
        if self.form == "lines":
            found["value"] = lines.cast(pa.string())
        else:
            fields = [f for f in target if f.name not in found]
            table = pa_json.read_json(pa.BufferReader(data), parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"))
            found.update({f.name: table.column(f.name).combine_chunks() for f in fields})
        return pa.RecordBatch.from_arrays([found[f.name] for f in target], schema=target)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, MemoryPartition)
        batch = self._batch()
        left = partition.rows
        while left > 0:
            part = batch if left >= batch.num_rows else batch.slice(0, left)
            left -= part.num_rows
            yield part


class MemorySource(DataSource):
    """``format("tierfs-bench-memory")``, options ``format`` (raw, json, lines), ``rows``,
    ``partitions`` and ``sample`` (whole JSON lines), with the tierfs read's schema."""

    @classmethod
    def name(cls) -> str:
        return "tierfs-bench-memory"

    def reader(self, schema: StructType) -> MemoryReader:
        return MemoryReader(dict(self.options), schema)


@dataclasses.dataclass(frozen=True)
class DiscardedMessage(WriterCommitMessage):
    rows: int
    encoded_bytes: int


class DiscardWriter(DataSourceArrowWriter):
    def __init__(self, schema: StructType, encode: bool) -> None:
        self.schema, self.encode = schema, encode

    def write(self, iterator: Iterator[Any]) -> DiscardedMessage:
        from tierfs.spark.write_encoding import BatchEncoder

        encoder = BatchEncoder.of("json", self.schema) if self.encode else None
        if self.encode and encoder is None:
            raise ValueError(f"no batch encoding for {self.schema.simpleString()}")
        rows = encoded = 0
        for batch in iterator:
            rows += batch.num_rows
            if encoder is not None:
                encoded += len(encoder.encode(batch))
        return DiscardedMessage(rows, encoded)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # nothing was kept


class ArrowDiscardSink(DataSource):
    """``format("tierfs-bench-arrow-discard")``, option ``encode`` (``0`` or ``1``)."""

    @classmethod
    def name(cls) -> str:
        return "tierfs-bench-arrow-discard"

    def writer(self, schema: StructType, overwrite: bool) -> DiscardWriter:
        return DiscardWriter(schema, self.options.get("encode", "0") == "1")
