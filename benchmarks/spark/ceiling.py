"""The ceilings of Spark's Python data source path on this machine, with no I/O. Reads: a
source whose executors yield Arrow batches of 1 MiB rows from memory, with the tierfs
raw schema (``MemorySource``), and one yielding the same Arrow batch of event rows again
and again, with the schema of the tierfs ``json`` or ``lines`` read it stands next to
(``ArrowMemorySource``). Writes: a sink whose tasks take the Arrow batches Spark hands a
``DataSourceArrowWriter`` (as the tierfs writer does) and discard them, or first encode
each with the tierfs writer's own ``BatchEncoder`` (``ArrowDiscardSink``). Its own module
so that importing ``benchmarks.spark`` stays free of pyspark."""

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
    def __init__(self, blocks: int) -> None:
        self.blocks = blocks


class MemoryReader(DataSourceReader):
    def __init__(self, size: int, partitions: int) -> None:
        self.size, self.count = size, partitions

    def partitions(self) -> list[MemoryPartition]:
        blocks = -(-self.size // MiB)
        share = -(-blocks // self.count)
        return [MemoryPartition(min(share, blocks - start)) for start in range(0, blocks, share)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow batches of ``RAW_BATCH_ROWS`` 1 MiB rows, as the tierfs source yields
        for 1 MiB blocks (one 4 MiB read piece per batch)."""
        import pyarrow as pa

        assert isinstance(partition, MemoryPartition)
        schema = pa.schema([("path", pa.string()), ("offset", pa.int64()), ("value", pa.binary())])
        block = os.urandom(MiB)
        for first in range(0, partition.blocks, RAW_BATCH_ROWS):
            rows = min(RAW_BATCH_ROWS, partition.blocks - first)
            offsets = [(first + i) * MiB for i in range(rows)]
            yield pa.RecordBatch.from_arrays(
                [pa.repeat("memory", rows), pa.array(offsets, pa.int64()), pa.array([block] * rows, pa.binary())],
                schema=schema)


class MemorySource(DataSource):
    """``format("tierfs-bench-memory")``, options ``size`` and ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return "tierfs-bench-memory"

    def schema(self) -> str:
        return "path string, offset long, value binary"

    def reader(self, schema: StructType) -> MemoryReader:
        return MemoryReader(int(self.options["size"]), int(self.options["partitions"]))


class ArrowMemoryPartition(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class ArrowMemoryReader(DataSourceReader):
    """Yields one Arrow batch built from ``sample`` (whole lines of the events file)
    again and again: what moving the rows of a batch into the JVM costs, with no I/O
    and no parsing in the timed part (the batch is built once per partition, by
    pyarrow's JSON reader for ``json``)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.sample, self.form, self.schema = options["sample"], options["format"], schema
        self.rows, self.count = int(options["rows"]), int(options["partitions"])

    def partitions(self) -> list[ArrowMemoryPartition]:
        share = -(-self.rows // self.count)
        return [ArrowMemoryPartition(min(share, self.rows - start)) for start in range(0, self.rows, share)]

    def _batch(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pa_json
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        with open(self.sample, "rb") as file:
            data = file.read()
        lines = pc.split_pattern(pa.array([data.rstrip(b"\n")], pa.binary()), "\n").flatten()
        offsets = pc.cumulative_sum(pc.add(pc.binary_length(lines).cast(pa.int64()), 1))
        columns: dict[str, Any] = {"path": pa.repeat("memory", len(lines)), "offset": offsets}
        if self.form == "lines":
            columns["value"] = lines.cast(pa.string())
        else:
            fields = [f for f in target if f.name not in columns]
            table = pa_json.read_json(pa.BufferReader(data), parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"))
            columns.update({f.name: table.column(f.name).combine_chunks() for f in fields})
        return pa.RecordBatch.from_arrays([columns[f.name] for f in target], schema=target)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ArrowMemoryPartition)
        batch = self._batch()
        left = partition.rows
        while left > 0:
            part = batch if left >= batch.num_rows else batch.slice(0, left)
            left -= part.num_rows
            yield part


class ArrowMemorySource(DataSource):
    """``format("tierfs-bench-arrow-memory")``, options ``sample`` (a file of whole
    JSON lines), ``format`` (``json`` or ``lines``), ``rows``, ``partitions``; the
    schema of the tierfs read it stands next to."""

    @classmethod
    def name(cls) -> str:
        return "tierfs-bench-arrow-memory"

    def reader(self, schema: StructType) -> ArrowMemoryReader:
        return ArrowMemoryReader(dict(self.options), schema)


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
