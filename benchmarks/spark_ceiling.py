"""The ceiling of Spark's Python data source path on this machine: a data source whose
executors yield 1 MiB rows from memory (no I/O, no CRC), with the tierfs raw schema.
Its own module so that importing ``benchmarks.spark`` stays free of pyspark."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

MiB = 1 << 20


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

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, MemoryPartition)
        block = os.urandom(MiB)
        for index in range(partition.blocks):
            yield ("memory", index * MiB, block)


class MemorySource(DataSource):
    """``format("tierfs-bench-memory")``, options ``size`` and ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return "tierfs-bench-memory"

    def schema(self) -> str:
        return "path string, offset long, value binary"

    def reader(self, schema: StructType) -> MemoryReader:
        return MemoryReader(int(self.options["size"]), int(self.options["partitions"]))
