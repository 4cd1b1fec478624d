"""The PySpark data source ``tierfs`` (Python Data Source API, PySpark >= 4.0).

    from tierfs.spark.source import register
    register(spark)
    spark.read.format("tierfs").load("tierfs://logs/")                    # lines
    spark.read.format("tierfs").option("format", "json").schema("path string, offset long, user string, n long").load("tierfs://events/")
    spark.read.format("tierfs").option("format", "raw").option("block_size", 65536).load("tierfs://blobs/b1")
    spark.readStream.format("tierfs").load("tierfs://logs/")              # follows growth and new segments
    df.write.format("tierfs").mode("append").save("tierfs://out/result")  # exactly once
    df.writeStream.format("tierfs").option("checkpointLocation", ...).start("tierfs://out/result")

Read options: ``path`` (a segment or a directory: every segment below it, skipping
names that start with ``_`` or ``.``), ``format`` (``lines`` default, ``json``,
``raw``), ``block_size`` (raw rows, default 1 MiB), ``partition_bytes`` (target
partition size, default 64 MiB), ``url`` / ``data_dir`` / ``token`` (how to reach the
daemon; default ``TIERFS_URL`` / ``TIERFS_DATA_DIR``), ``chunk_storage_options`` (JSON:
fsspec options that let executors read S3 chunks, in tier-2 or offloaded, directly) and,
for streams, ``starting`` (``earliest`` default, ``latest``). Every row has ``path`` and
``offset`` (the record's first byte) columns: ``lines`` and ``json`` give one row per
newline-terminated record (the last one of a sealed segment may lack its newline),
``raw`` one row per ``block_size`` bytes. Executors yield the rows as Arrow record
batches (``batches``); ``json_columns`` says how JSON lines become columns.

Write options: ``path`` (the target segment, created if missing), ``format`` (``json``
default, ``lines``, ``raw``), ``url`` / ``data_dir`` / ``token`` and, for streams,
``writer_id``. See ``read``, ``stream`` and ``write`` beside this module for the
guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.spark.hook_errors import tierfs_errors

if TYPE_CHECKING:
    from tierfs.spark.stream import TierStreamReader
    from tierfs.spark.write import TierStreamWriter, TierWriter

# Spark imports this module in a fresh Python process for every planning step (listing
# the sources, creating one, planning a read or a write, committing it): what reading
# and writing need (pyarrow, numpy, the HTTP client) is imported by the step that uses
# it, so the steps that only ask a name or a schema start in half the time.
DEFAULT_SCHEMAS = {
    "lines": "path string, offset long, value string",
    "raw": "path string, offset long, value binary",
}


@tierfs_errors
class TierReader(DataSourceReader):
    """Batch reads: one snapshot per segment (durable length and chunk layout) taken on
    the driver when the query is planned."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        from tierfs.spark.read import ReadOptions, check_schema

        self.options = ReadOptions.parse(options)
        self.schema = schema
        check_schema(self.options, schema)

    def partitions(self) -> list[Any]:
        from tierfs.spark.read import plan_partitions, plan_ranges, walk_segments

        client = self.options.client()
        try:
            ranges = []
            for segment in walk_segments(client, self.options.path):
                layout = client.layout(segment.name)
                ranges += plan_ranges(segment.name, layout, segment.start_offset, segment.length,
                                      self.options.partition_bytes, segment.start_offset)
        finally:
            client.close()
        return plan_partitions(ranges, self.options.partition_bytes)

    def read(self, partition: InputPartition) -> Any:
        """Arrow record batches of the partition (tuples for a schema they cannot build)."""
        from tierfs.spark.read import read_partition

        return read_partition(self.options, self.schema, partition)


@tierfs_errors
class TierDataSource(DataSource):
    """``format("tierfs")``: see the module docstring."""

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

    def streamReader(self, schema: StructType) -> TierStreamReader:
        from tierfs.spark.stream import TierStreamReader

        return TierStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> TierWriter:
        from tierfs.spark.write import TierWriter

        return TierWriter.for_schema(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TierStreamWriter:
        from tierfs.spark.write import TierStreamWriter

        return TierStreamWriter.for_schema(dict(self.options), schema, overwrite)


def register(spark: Any) -> None:
    """Make ``format("tierfs")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(TierDataSource)
