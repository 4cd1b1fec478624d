"""JSON lines into Arrow columns for ``format("json")``: pyarrow's C++ reader for the
block, the per-record parse (``json.loads``, as the source always did) for whatever the
C++ reader might read differently.

The per-record semantics are the reference: a blank line (``line.strip()`` empty) is a
row whose JSON columns are all null; any other line must be one JSON object
(``json.loads``), else ``InvalidArgumentError`` names the segment and the line's
offset; fields missing from it are null, fields not in the schema are ignored; a
string column takes a non-string value as ``str(value)`` (``true``/``false`` for
booleans); a number column takes what ``pyarrow.array`` makes of the Python value.
A value that does not fit its column is an ``InvalidArgumentError`` naming the
offset, the field and the value. Timestamp columns take ISO 8601 strings (UTC unless
they carry an offset), read by pyarrow in both paths.

Invariants (each keeps the C++ path equal to the reference, and is checked against it on
random data by tests/test_spark_arrow.py):
- pyarrow parses a block only when it is valid UTF-8 and every non-blank line begins
  with ``{`` and ends with ``}``: then each line is a separate top-level value, and the
  row count must equal the non-blank line count, so each line is exactly one object.
  pyarrow is never given a block that begins with another top-level value (a leading
  ``null`` crashes pyarrow 26's reader).
- Any error from pyarrow, or a count that differs, sends the block to the per-record
  parse, which raises the reference error on the first bad line.
- Lines pyarrow reads but ``json.loads`` may not, or may read to another value, are
  parsed again per record and their values replaced: ``-NaN``/``Inf``/``-Inf``
  literals (rapidjson takes them), float columns holding a negative zero (``-0`` is
  the integer 0 for ``json.loads``) or of magnitude 2**53 (2**24 for float) and up,
  which an integer literal gives exactly or not at all; nulls in a NOT NULL column.
- Float columns are parsed as double, then narrowed like ``pyarrow.array`` narrows a
  Python float, so both paths round the same way.

Two deliberate differences from the old per-record source: a null in a NOT NULL column
is an ``InvalidArgumentError`` (it used to reach the JVM as a null), and a line nested
deeper than ``json.loads`` can follow (Python's recursion limit, about 1000 levels) is
read by pyarrow when its block takes the C++ path (the per-record parse refuses it).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    TimestampType,
)

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.spark.records import Lines

# Spark types pyarrow's JSON reader reads like the per-record path, and the Arrow type it
# parses each into (float is parsed as double, then narrowed: see the module docstring).
READ_TYPES: dict[type[DataType], pa.DataType] = {
    StringType: pa.string(), LongType: pa.int64(), IntegerType: pa.int32(), ShortType: pa.int16(),
    ByteType: pa.int8(), DoubleType: pa.float64(), FloatType: pa.float64(), BooleanType: pa.bool_(),
    TimestampType: pa.timestamp("us", tz="UTC"),
}
EXACT_INTEGER_LIMITS: dict[type[DataType], float] = {DoubleType: float(1 << 53), FloatType: float(1 << 24)}
# Literals rapidjson reads as numbers and json.loads refuses (``Inf``, ``-Inf``, ``-NaN``;
# ``Infinity`` and ``NaN`` both take). Each is looked for only if the block holds its
# capital letter (one memchr, ~30x faster than searching the literal itself).
LENIENT_LITERALS = ((b"I", b"Inf", re.compile(rb"Inf[ \t\r]*[,}\]]")),
                    (b"N", b"-NaN", re.compile(rb"-NaN[ \t\r]*[,}\]]")))
JSON_WHITESPACE = b" \t\r"
OPEN, CLOSE, CARRIAGE_RETURN = ord("{"), ord("}"), ord("\r")


def json_record(path: str, offset: int, line: bytes) -> dict[str, Any]:
    """The reference parse of one line: {} for a blank line, else one JSON object."""
    if not line.strip():
        return {}
    try:
        record = json.loads(line)
    except ValueError as e:
        raise InvalidArgumentError(f"{path!r} at offset {offset}: not a JSON line ({e})") from None
    except RecursionError:
        raise InvalidArgumentError(f"{path!r} at offset {offset}: a JSON line nested too deeply") from None
    if not isinstance(record, dict):
        raise InvalidArgumentError(f"{path!r} at offset {offset}: a JSON line must hold an object")
    return record


@dataclasses.dataclass(frozen=True)
class JsonColumns:
    """The schema fields read from JSON, their Arrow output types, and what pyarrow parses."""

    fields: tuple[StructField, ...]
    types: tuple[pa.DataType, ...]
    read_schema: pa.Schema

    @classmethod
    def of(cls, fields: list[StructField], types: list[pa.DataType]) -> JsonColumns | None:
        """None when a field has a type outside ``READ_TYPES`` (nested, decimal, date,
        ...): such schemas keep the per-record path for every line."""
        if any(type(f.dataType) not in READ_TYPES for f in fields):
            return None
        read = pa.schema([pa.field(f.name, READ_TYPES[type(f.dataType)]) for f in fields])
        return cls(tuple(fields), tuple(types), read)

    def columns(self, path: str, lines: Lines) -> list[pa.Array]:
        """One array per field, a value per line of ``lines``."""
        parsed = self._parse(lines)
        if parsed is None:
            return self._per_record(path, lines, list(range(len(lines))))
        suspects = self._suspects(lines, parsed)
        parsed = [array.cast(kind, safe=False) if array.type != kind else array
                  for array, kind in zip(parsed, self.types, strict=True)]
        if not suspects:
            return parsed
        replaced = self._per_record(path, lines, suspects)
        mask = _mask(len(lines), suspects)
        return [pc.replace_with_mask(array, mask, values)
                for array, values in zip(parsed, replaced, strict=True)]

    def _parse(self, lines: Lines) -> list[pa.Array] | None:
        """pyarrow's parse of the block, a value per line (null for blank lines); None
        when the block must be parsed per record."""
        data = lines.data
        try:
            _whole(data, pa.string()).validate(full=True)
        except pa.ArrowInvalid:
            return None  # not UTF-8: json.loads decides which line is at fault
        blank = _blank_lines(lines)
        if blank is None:
            return None
        objects = len(lines) - len(blank)
        if objects == 0:
            return [pa.nulls(len(lines), field.type) for field in self.read_schema]
        try:
            table = pa_json.read_json(
                pa.BufferReader(data),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=data.size),
                parse_options=pa_json.ParseOptions(explicit_schema=self.read_schema,
                                                   unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != objects:
            return None  # a line held more than one value
        arrays = [column.combine_chunks() for column in table.columns]
        if blank:
            is_object = pc.invert(_mask(len(lines), blank))
            rows = pc.subtract(pc.cumulative_sum(is_object.cast(pa.int64())), 1)
            indices = pc.if_else(is_object, rows, pa.scalar(None, pa.int64()))
            arrays = [array.take(indices) for array in arrays]
        return arrays

    def _suspects(self, lines: Lines, parsed: list[pa.Array]) -> list[int]:
        """Lines whose pyarrow values may differ from the reference (module docstring)."""
        masks = []
        lenient = _lenient_literal_lines(lines)
        if lenient:
            masks.append(_mask(len(lines), lenient))
        for field, array in zip(self.fields, parsed, strict=True):
            limit = EXACT_INTEGER_LIMITS.get(type(field.dataType))
            if limit is not None:
                zero = pc.equal(array, 0.0)
                negative_zero = pc.and_(zero, pc.less(pc.divide(pa.scalar(1.0), array), 0.0))
                masks.append(pc.or_(negative_zero, pc.greater_equal(pc.abs(array), limit)))
            if not field.nullable and array.null_count:
                masks.append(array.is_null())
        if not masks:
            return []
        mask = masks[0]
        for other in masks[1:]:
            mask = pc.or_kleene(mask, other)
        result: list[int] = pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist()
        return result

    def _per_record(self, path: str, lines: Lines, indices: list[int]) -> list[pa.Array]:
        """The reference values of the lines at ``indices``, one array per field."""
        chosen = pa.array(indices, pa.int64())
        offsets = lines.offsets.take(chosen).to_pylist()
        records = [json_record(path, offset, line)
                   for offset, line in zip(offsets, lines.values.take(chosen).to_pylist(), strict=True)]
        return [python_column([r.get(field.name) for r in records], field, kind, path, offsets)
                for field, kind in zip(self.fields, self.types, strict=True)]


def python_column(values: list[Any], field: StructField, kind: pa.DataType, path: str,
                  offsets: list[int]) -> pa.Array:
    """An Arrow column from JSON values as the per-record path converts them."""
    if not field.nullable:
        for value, offset in zip(values, offsets, strict=True):
            if value is None:
                raise InvalidArgumentError(f"{path!r} at offset {offset}: field {field.name!r} is "
                                           "missing or null, and the schema says NOT NULL")
    if isinstance(field.dataType, TimestampType):
        return _timestamps(values, field, kind, path, offsets)
    if isinstance(field.dataType, StringType):
        values = [_as_string(value) for value in values]
    try:
        return pa.array(values, type=kind)
    except (ValueError, TypeError, OverflowError):
        for value, offset in zip(values, offsets, strict=True):
            try:
                pa.array([value], type=kind)
            except (ValueError, TypeError, OverflowError):
                raise _unfit(path, offset, field, value) from None
        raise


def _as_string(value: Any) -> Any:
    """What Spark makes of a Python value for a string column (``convert_string``)."""
    if value is None or type(value) is str:
        return value
    if value is True or value is False:
        return "true" if value else "false"
    return str(value)


def _timestamps(values: list[Any], field: StructField, kind: pa.DataType, path: str,
                offsets: list[int]) -> pa.Array:
    """ISO 8601 strings read by pyarrow's JSON reader, as in the C++ path."""
    lines = []
    for value, offset in zip(values, offsets, strict=True):
        if value is not None and not isinstance(value, str):
            raise _unfit(path, offset, field, value)
        lines.append(b"{}" if value is None else b'{"t":' + json.dumps(value).encode() + b"}")
    schema = pa.schema([pa.field("t", kind)])

    def parse(chosen: list[bytes]) -> pa.Array:
        options = pa_json.ParseOptions(explicit_schema=schema)
        table = pa_json.read_json(pa.BufferReader(b"\n".join(chosen) + b"\n"), parse_options=options,
                                  read_options=pa_json.ReadOptions(use_threads=False))
        return table.column(0).combine_chunks()

    try:
        return parse(lines)
    except pa.ArrowInvalid:
        for line, value, offset in zip(lines, values, offsets, strict=True):
            try:
                parse([line])
            except pa.ArrowInvalid:
                raise _unfit(path, offset, field, value) from None
        raise


def _unfit(path: str, offset: int, field: StructField, value: Any) -> InvalidArgumentError:
    return InvalidArgumentError(f"{path!r} at offset {offset}: field {field.name!r} is {value!r}, "
                                f"which is not a {field.dataType.simpleString()}")


def _lenient_literal_lines(lines: Lines) -> list[int]:
    """Lines that may hold a literal in ``LENIENT_LITERALS`` (or text that looks like one)."""
    positions = []
    for letter, needle, pattern in LENIENT_LITERALS:
        block = lines.block
        if block.find(letter, lines.low, lines.high) >= 0 and block.find(needle, lines.low, lines.high) >= 0:
            positions += [m.start() - lines.low for m in pattern.finditer(block, lines.low, lines.high)]
    if not positions:
        return []
    starts = lines.relative_starts().to_pylist()
    return sorted({bisect.bisect_right(starts, position) - 1 for position in positions})


def _mask(length: int, indices: list[int]) -> pa.Array:
    """A boolean array of ``length``, true at ``indices``."""
    flags = [False] * length
    for index in indices:
        flags[index] = True
    return pa.array(flags, pa.bool_())


def _whole(data: pa.Buffer, kind: pa.DataType) -> pa.Array:
    """``data`` as one value of an Arrow array of ``kind`` (binary or string), not copied."""
    return pa.Array.from_buffers(kind, 1, [None, pa.array([0, data.size], pa.int32()).buffers()[1], data])


def _blank_lines(lines: Lines) -> list[int] | None:
    """Indices of the blank lines; None when a non-blank line does not begin with ``{``
    and end with ``}`` (JSON whitespace aside). Checked on each line's first and last
    bytes in C++; only lines that fail that are looked at in Python."""
    data = lines.data
    u8 = pa.Array.from_buffers(pa.uint8(), data.size, [None, data])
    starts = lines.relative_starts()
    lengths = pc.binary_length(lines.values).cast(pa.int64())
    last = pc.max_element_wise(pc.subtract(pc.add(starts, lengths), 1), 0)
    before_last = pc.max_element_wise(pc.subtract(last, 1), 0)
    last_byte = u8.take(last)
    closes = pc.or_(pc.equal(last_byte, CLOSE),
                    pc.and_(pc.equal(last_byte, CARRIAGE_RETURN), pc.equal(u8.take(before_last), CLOSE)))
    plain = pc.and_(pc.and_(pc.equal(u8.take(starts), OPEN), closes), pc.greater(lengths, 1))
    blank = []
    for index in pc.indices_nonzero(pc.invert(plain)).to_pylist():
        line = lines.values[index].as_py()
        if not line.strip():
            blank.append(index)
            continue
        stripped = line.strip(JSON_WHITESPACE)
        if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
            return None
    return blank
