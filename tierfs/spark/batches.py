"""Arrow record batches of a segment range for the Spark source: PySpark >= 4.0 takes
``pyarrow.RecordBatch``es from ``DataSourceReader.read`` and hands them to the JVM as
they are, instead of converting a Python tuple per row.

Lines are split and decoded in C++ (``records.split_block``, a UTF-8 cast), JSON is
parsed by pyarrow (``json_columns``), raw blocks are slices of the read piece; the
``path`` column repeats the segment's name and ``offset`` is each record's first byte.

Invariants:
- Every batch has exactly Spark's Arrow form of the read schema
  (``to_arrow_schema(schema, timezone="UTC")``): PySpark checks the first batch against
  it and passes the rest on unchecked.
- A batch comes from one block of whole records (``lines``, ``json``) or one read piece
  (``raw``) and has at most ``MAX_BATCH_ROWS`` rows, so memory is bounded by the read
  piece and the longest record (times ``parse_threads`` blocks in work at once), never
  by the partition. Batches keep the blocks' order whatever the threads.
- The rows are the per-record path's (``read.tuple_rows``), value for value: ``lines``
  decodes UTF-8 with replacement like ``bytes.decode("utf-8", "replace")``, ``json``
  follows ``json_columns``. ``lines`` and ``raw`` columns come from ``record_columns``
  on both paths. A schema the batches cannot build that way (no Arrow form; types
  outside ``json_columns.READ_TYPES`` for ``json``) keeps the per-record path:
  ``BatchShape.of`` returns None.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.spark.json_columns import JsonColumns
from tierfs.spark.parallel import ordered_map
from tierfs.spark.records import Lines, split_block

log = logging.getLogger(__name__)

# 64 Ki rows: with one copy of the segment's name per row in the path column, a batch
# of tiny records stays a few MiB, like the 4 MiB piece it comes from.
MAX_BATCH_ROWS = 1 << 16
PATH, OFFSET = -1, -2  # column sources besides an index into the value columns
SEGMENT_COLUMNS = {"path": (PATH, StringType), "offset": (OFFSET, LongType)}


@dataclasses.dataclass(frozen=True)
class BatchShape:
    """How the columns of a batch are made: for each output column, the segment's path,
    the record's offset, or the index of a value column (the line, the block or a JSON
    field)."""

    format: str
    arrow_schema: pa.Schema
    sources: tuple[int, ...]
    json: JsonColumns | None

    @classmethod
    def of(cls, form: str, schema: StructType) -> BatchShape | None:
        try:
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
        except (TypeError, ValueError, NotImplementedError) as e:
            log.info("tierfs: schema %s has no Arrow form (%s); rows go one by one", schema.simpleString(), e)
            return None
        if form in ("lines", "raw"):
            return cls(form, arrow_schema, record_columns(form, schema), None)
        names = [field.name for field in schema.fields]
        if len(set(names)) != len(names):
            return None
        sources: list[int] = []
        json_fields: list[StructField] = []
        json_types: list[pa.DataType] = []
        for index, field in enumerate(schema.fields):
            if field.name in SEGMENT_COLUMNS:
                source, kind = SEGMENT_COLUMNS[field.name]
                if not isinstance(field.dataType, kind):
                    return None
                sources.append(source)
            else:
                sources.append(len(json_fields))
                json_fields.append(field)
                json_types.append(arrow_schema.field(index).type)
        columns = JsonColumns.of(json_fields, json_types)
        if columns is None:
            log.info("tierfs: schema %s has a type pyarrow's JSON reader does not read like "
                     "json.loads; rows go one by one", schema.simpleString())
            return None
        return cls(form, arrow_schema, tuple(sources), columns)

    def batch(self, path: str, offsets: pa.Array, values: list[pa.Array]) -> pa.RecordBatch:
        columns = []
        for source in self.sources:
            if source == PATH:
                columns.append(pa.repeat(path, len(offsets)))
            elif source == OFFSET:
                columns.append(offsets)
            else:
                columns.append(values[source])
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


def record_columns(form: str, schema: StructType) -> tuple[int, ...]:
    """Where each column of a ``lines`` or ``raw`` read comes from (``PATH``, ``OFFSET``
    or 0, the record): by name when every column is ``path``, ``offset`` or ``value``
    (any of them, in any order: ``.schema("value string")`` reads what
    ``spark.read.text`` does), else by position for three columns typed like the
    default schema. Any other schema is refused: nothing could fill its columns."""
    value_type, value_name = (StringType, "string") if form == "lines" else (BinaryType, "binary")
    by_name = {"path": (PATH, StringType), "offset": (OFFSET, LongType), "value": (0, value_type)}
    names = schema.fieldNames()
    if names and len(set(names)) == len(names) and all(name in by_name for name in names):
        if all(isinstance(field.dataType, by_name[field.name][1]) for field in schema.fields):
            return tuple(by_name[name][0] for name in names)
    elif [type(field.dataType) for field in schema.fields] == [StringType, LongType, value_type]:
        return (PATH, OFFSET, 0)
    raise InvalidArgumentError(
        f"format {form} reads the columns path string, offset long, value {value_name} (any of them, "
        f"in any order, by name); the schema {schema.simpleString()} has others")


def line_batches(shape: BatchShape, path: str, blocks: Iterable[tuple[int, bytes]],
                 threads: int = 1) -> Iterator[pa.RecordBatch]:
    """Batches of ``lines`` or ``json`` rows from blocks of whole records, ``threads``
    blocks split and parsed at once (``parallel.ordered_map``: the order is kept)."""

    def block_batches(item: tuple[int, bytes]) -> list[pa.RecordBatch]:
        block_start, block = item
        lines = split_block(block_start, block)
        built = []
        for first in range(0, len(lines), MAX_BATCH_ROWS):
            part = lines.slice(first, first + MAX_BATCH_ROWS)
            values = shape.json.columns(path, part) if shape.json is not None else [decode(part)]
            built.append(shape.batch(path, part.offsets, values))
        return built

    for built in ordered_map(block_batches, blocks, threads):
        yield from built


def decode(lines: Lines) -> pa.Array:
    """The lines as strings, invalid UTF-8 replaced like ``bytes.decode("utf-8", "replace")``."""
    try:
        return lines.values.cast(pa.string())
    except pa.ArrowInvalid:
        # Decoding the block at once equals decoding line by line: a newline is never
        # part of a multi-byte sequence, and a replacement character holds none.
        text = lines.data.to_pybytes().decode("utf-8", "replace").encode()
        return split_block(0, text).values.cast(pa.string())


def raw_batches(shape: BatchShape, path: str, pieces: Iterable[tuple[int, bytes]],
                block_size: int) -> Iterator[pa.RecordBatch]:
    """Batches of ``raw`` rows: each piece (whole blocks, from ``read.iter_block_pieces``)
    cut into ``block_size`` rows without copying."""
    for piece_start, piece in pieces:
        count = -(-len(piece) // block_size)
        for first in range(0, count, MAX_BATCH_ROWS):
            rows = min(MAX_BATCH_ROWS, count - first)
            low = first * block_size
            bounds = pa.array([min(low + i * block_size, len(piece)) - low for i in range(rows + 1)], pa.int32())
            data = pa.py_buffer(piece).slice(low, bounds[-1].as_py())
            blocks = pa.Array.from_buffers(pa.binary(), rows, [None, bounds.buffers()[1], data])
            offsets = pc.add(bounds.slice(0, rows).cast(pa.int64()), piece_start + low)
            yield shape.batch(path, offsets, [blocks])
