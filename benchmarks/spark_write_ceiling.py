"""The ceilings of a Spark write through a Python data source on this machine, with no
I/O: a sink whose Python tasks take the Arrow record batches Spark hands a
``DataSourceArrowWriter`` (as the tierfs writer takes them) and discard them
(``encode`` ``0``), or first encode each into JSON lines with the tierfs writer's own
``BatchEncoder`` (``encode`` ``1``): what handing the rows to Python costs, and that
plus the encoding, beside the tierfs write that adds the appends to the daemon. Its
own module so that importing ``benchmarks.spark`` stays free of pyspark."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType


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
