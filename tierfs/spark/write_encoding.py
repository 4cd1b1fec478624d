"""How the Spark writer turns rows into the bytes it appends: one row at a time for
Spark ``Row``s (``encode_row``: the reference), or whole Arrow record batches at once
(``BatchEncoder``), which PySpark >= 4.0 hands a ``DataSourceArrowWriter`` instead of
building a ``Row`` per row.

Formats: ``json`` writes ``json.dumps(row.asDict(recursive=True), default=json_default,
separators=(",", ":"))`` and a newline per row; ``lines`` the string value and a newline
(a null: just the newline); ``raw`` the binary value's bytes (a null: nothing).

Invariants:
- A batch encodes to exactly the bytes the rows encode to one by one, as the per-row
  writer gets them from PySpark (timestamps as naive local time, like
  ``ArrowTableToRowsConversion``; ``ensure_ascii`` strings; ``NaN``/``Infinity``;
  ``float.__repr__``). ``BatchEncoder.of`` returns None for a schema with a type outside
  ``BATCH_JSON_TYPES`` (or duplicate names, or no column): those rows go one by one.
- Within a batch, values the vectorised path cannot render exactly are rendered one
  by one in Python with the reference conversion: a string column with non-ASCII or
  control characters, a timestamp column when the local zone has no known name or a
  year is outside 1000-9999 (outside 1970-2037 in a zone other than UTC), and the
  floats that repr writes with an exponent (or NaN, infinities).
- Memory: one batch's encoded bytes (64-bit offsets, so a batch of any size fits).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import functools
import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Row
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

WRITE_FORMATS = ("json", "lines", "raw")
INTEGER_TYPES = (LongType, IntegerType, ShortType, ByteType)
BATCH_JSON_TYPES = (StringType, *INTEGER_TYPES, BooleanType, DoubleType, FloatType, TimestampType, DateType)
CONTROL_CHARACTERS = r"[\x00-\x1f\x7f]"  # json.dumps escapes these (and non-ASCII) as \uXXXX
_encode_value = json.JSONEncoder().encode  # json.dumps of one value, defaults
UTC_ZONES = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Zulu", "Etc/Zulu", "GMT", "Etc/GMT"})
# Years in which a zone's offsets come from its table of transitions: the C library
# (Python's astimezone) extends a zone's last rule into the far future, Arrow does not,
# so other years of a zone that is not UTC are converted value by value.
ZONE_RULES_YEARS = (1970, 2037)


def json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def encode_row(form: str, row: Row) -> bytes:
    """One row as the writer appends it (the reference for ``BatchEncoder``)."""
    if form == "json":
        return json.dumps(row.asDict(recursive=True), default=json_default, separators=(",", ":")).encode() + b"\n"
    value = row[0]
    if value is None:
        return b"" if form == "raw" else b"\n"
    return bytes(value) if form == "raw" else str(value).encode() + b"\n"


# ------------------------------------------------------------ column renderers
# Each takes one Arrow column and returns its values as JSON texts (large_string, no
# nulls: a null is "null").

def _per_value(values: pa.Array, text: Callable[[Any], str]) -> pa.Array:
    return pa.array(["null" if v is None else text(v) for v in values.to_pylist()], pa.large_string())


def _null_as_text(texts: pa.Array) -> pa.Array:
    return pc.fill_null(texts.cast(pa.large_string()), "null")


def _string(values: pa.Array) -> pa.Array:
    simple = (pc.all(pc.string_is_ascii(values)).as_py() is not False
              and pc.any(pc.match_substring_regex(values, CONTROL_CHARACTERS)).as_py() is not True)
    if not simple:
        return _per_value(values, _encode_value)
    escaped = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
    return _null_as_text(pc.binary_join_element_wise('"', escaped, '"', ""))


def _integer(values: pa.Array) -> pa.Array:
    return _null_as_text(values.cast(pa.string()))


def _boolean(values: pa.Array) -> pa.Array:
    return _null_as_text(pc.if_else(values, "true", "false"))


def _float(values: pa.Array) -> pa.Array:
    """``float.__repr__`` of each value (a float32 widened to the double Python sees).
    Arrow's shortest round-trip text has repr's digits; where repr writes them plainly
    (0 and magnitudes in [1e-4, 1e16)) it differs only by repr's ".0" on whole
    numbers. Other values (exponents, NaN, infinities) are rendered in Python."""
    doubles = values.cast(pa.float64())
    texts = doubles.cast(pa.string())
    magnitude = pc.abs(doubles)
    plain = pc.and_(pc.or_(pc.and_(pc.greater_equal(magnitude, 1e-4), pc.less(magnitude, 1e16)),
                           pc.equal(doubles, 0.0)),
                    pc.invert(pc.match_substring(texts, "e")))
    rendered = pc.if_else(pc.match_substring(texts, "."), texts, pc.binary_join_element_wise(texts, ".0", ""))
    others = pc.and_(pc.is_valid(doubles), pc.invert(pc.fill_null(plain, True)))
    if pc.any(others).as_py():
        replacements = [_encode_value(v) for v in doubles.filter(others).to_pylist()]
        rendered = pc.replace_with_mask(rendered, others, pa.array(replacements, pa.string()))
    return _null_as_text(rendered)


def _date(values: pa.Array) -> pa.Array:
    return _per_value(values, lambda day: f'"{day.isoformat()}"')


def _local_timestamp_text(value: datetime.datetime) -> str:
    """What the per-row path writes: PySpark's row conversion (to naive local time)
    then ``isoformat``."""
    return f'"{value.astimezone().replace(tzinfo=None).isoformat()}"'


@functools.lru_cache(maxsize=4)
def _zone_name(tz_variable: str | None) -> str | None:
    """The IANA name of the local time zone (from ``TZ`` or ``/etc/localtime``), if any."""
    if tz_variable is not None:
        name = tz_variable.lstrip(":") or "UTC"
        return name if os.path.isfile(os.path.join("/usr/share/zoneinfo", name)) else None
    target = os.path.realpath("/etc/localtime")
    marker = "/zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else None


def _timestamp(values: pa.Array) -> pa.Array:
    kind = values.type
    zone = _zone_name(os.environ.get("TZ"))
    if zone is None or kind.unit != "us" or kind.tz is None or values.null_count == len(values):
        return _per_value(values, _local_timestamp_text)
    try:
        local = pc.local_timestamp(values.cast(pa.timestamp("us", tz=zone)))  # naive, local time
        years = pc.min_max(pc.year(local)).as_py()
        low, high = (1000, 9999) if zone in UTC_ZONES else ZONE_RULES_YEARS
        if years["min"] < low or years["max"] > high:
            return _per_value(values, _local_timestamp_text)
        # "YYYY-MM-DD HH:MM:SS.ffffff"; isoformat has a T and leaves out ".000000"
        text = pc.replace_substring(local.cast(pa.string()), " ", "T", max_replacements=1)
        text = pc.if_else(pc.ends_with(text, ".000000"), pc.utf8_slice_codeunits(text, 0, 19), text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _per_value(values, _local_timestamp_text)
    rendered = _null_as_text(pc.binary_join_element_wise('"', text, '"', ""))
    first = pc.index(pc.is_valid(values), True).as_py()  # a check of the zone's rules
    if rendered[first].as_py() != _local_timestamp_text(values[first].as_py()):
        return _per_value(values, _local_timestamp_text)
    return rendered


def _renderer(kind: DataType) -> Callable[[pa.Array], pa.Array]:
    if isinstance(kind, StringType):
        return _string
    if isinstance(kind, INTEGER_TYPES):
        return _integer
    if isinstance(kind, BooleanType):
        return _boolean
    if isinstance(kind, (DoubleType, FloatType)):
        return _float
    if isinstance(kind, TimestampType):
        return _timestamp
    if isinstance(kind, DateType):
        return _date
    raise TypeError(f"no batch renderer for {kind.simpleString()}")


# --------------------------------------------------------------------- batches
def _column(batch: pa.RecordBatch, index: int) -> pa.Array:
    column = batch.column(index)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _text_bytes(texts: pa.Array) -> pa.Buffer:
    """The values of a (large_)string or binary array, back to back, not copied."""
    if len(texts) == 0:
        return pa.py_buffer(b"")
    wide = pa.types.is_large_string(texts.type) or pa.types.is_large_binary(texts.type)
    offsets = pa.Array.from_buffers(pa.int64() if wide else pa.int32(), len(texts) + 1,
                                    [None, texts.buffers()[1]], offset=texts.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    data = texts.buffers()[2]
    return data.slice(start, end - start) if data is not None else pa.py_buffer(b"")


@dataclasses.dataclass(frozen=True)
class BatchEncoder:
    """Encodes whole Arrow record batches of one schema (see the module docstring)."""

    form: str
    keys: tuple[str, ...]  # json: '{"name":' for the first column, ',"name":' for the rest
    renderers: tuple[Callable[[pa.Array], pa.Array], ...]

    @classmethod
    def of(cls, form: str, schema: StructType) -> BatchEncoder | None:
        if form in ("lines", "raw"):
            return cls(form, (), ())  # the writer checked: one string / binary column
        names = schema.fieldNames()
        if not names or len(set(names)) != len(names):
            return None
        if not all(isinstance(field.dataType, BATCH_JSON_TYPES) for field in schema.fields):
            return None
        keys = tuple(("{" if i == 0 else ",") + json.dumps(name) + ":" for i, name in enumerate(names))
        return cls(form, keys, tuple(_renderer(field.dataType) for field in schema.fields))

    def encode(self, batch: pa.RecordBatch) -> pa.Buffer:
        if batch.num_rows == 0:
            return pa.py_buffer(b"")
        if self.form == "raw":
            values = _column(batch, 0)
            return _text_bytes(pc.fill_null(values, b"") if values.null_count else values)
        if self.form == "lines":
            values = pc.fill_null(_column(batch, 0).cast(pa.large_string()), "")
            newline, nothing = pa.scalar("\n", pa.large_string()), pa.scalar("", pa.large_string())
            return _text_bytes(pc.binary_join_element_wise(values, newline, nothing))
        parts: list[Any] = []
        for index, (key, render) in enumerate(zip(self.keys, self.renderers, strict=True)):
            parts += [pa.scalar(key, pa.large_string()), render(_column(batch, index))]
        parts += [pa.scalar("}\n", pa.large_string()), pa.scalar("", pa.large_string())]
        return _text_bytes(pc.binary_join_element_wise(*parts))
