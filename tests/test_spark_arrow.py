"""The Spark source's Arrow record batches against its per-record reference: one tuple
per record (``read.tuple_rows``'s semantics) through PySpark's own tuple-to-Arrow
conversion, which is what the source did before it yielded batches.

In-process on random JSON and lines data (well-formed, badly formed, odd numbers and
strings) cut into random pieces and ranges; through a real daemon with random
partition sizes; and through Spark on local[2] (the session-wide ``spark`` fixture): a
line longer than the read piece, records split across partitions, blank lines, the
error for a bad JSON line."""

from __future__ import annotations

import json
import math
import random
import re
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.spark.batches import BatchShape, line_batches
from tierfs.spark.json_columns import json_record
from tierfs.spark.read import READ_PIECE_BYTES, ReadOptions, read_partition
from tierfs.spark.records import record_blocks, split_lines
from tierfs.spark.source import TierReader
from tierfs.testing.harness import Daemon, start_daemon

KiB = 1 << 10
KINDS = {"string": StringType(), "long": LongType(), "int": IntegerType(), "smallint": ShortType(),
         "tinyint": ByteType(), "double": DoubleType(), "float": FloatType(), "boolean": BooleanType(),
         "timestamp": TimestampType()}
LINES_SCHEMA = "path string, offset long, value string"
JSON_SCHEMAS = [
    "path string, offset long, user string, n long, score double, ok boolean",
    "user string, small int, f float, offset long",
    "n long, path string",
    "path string, offset long",
    "tiny tinyint, short smallint, extra string, score double",
]
FIELD_KINDS = {"user": "string", "n": "long", "score": "double", "ok": "boolean", "small": "int",
               "f": "float", "extra": "string", "tiny": "tinyint", "short": "smallint"}
ODD_LINES = [  # blank, badly formed, or read differently by json.loads and rapidjson
    b"", b"   ", b"\t", b"\r", b"\x0c", b"null", b"[1]", b"5", b'"s"', b"{} {}", b"{}{}",
    b'{"a":1}\t{"b":2}', b'{"n":-NaN}', b'{"x":Inf}', b'{"score":-Inf}', b'{"x":[1,Inf]}', b'{"a":1,}',
    b"{'a':1}", b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', b'\xef\xbb\xbf{"a":1}', b'{"a":"x\x01"}',
    b'{"n":1}}', b'{"n":01}', b'{"n":-0}', b'{"score":-0}', b'{"n":1e2}', b'{"n":1.0}', b'{"user":5}',
    b'{"user":{"a":[1,2]}}', b'{"user":"a","user":"b"}', b'{"ok":1}', b'{"n":true}', b'{"us\\u0065r":"e"}',
    b'{"score":12345678901234567891}', b'{"f":16777217}', b'{"a":NaN,"score":Infinity}', b'{"a":"\\ud800"}',
    b'{"a":"\\ud83d\\ude00"}', b"{", b"}", b'{"a":1', b'{"a":"b\\"}', b'{"m":"level:Info, x:Inf}"}',
]


def schema_of(ddl: str) -> StructType:
    """``name type[, ...]`` (``not null`` as a third word) without a Spark session."""
    fields = []
    for part in ddl.split(","):
        words = part.split()
        fields.append(StructField(words[0], KINDS[words[1]], nullable=len(words) == 2))
    return StructType(fields)


class _Source:
    @classmethod
    def name(cls) -> str:
        return "tierfs"


def reference_tuples(form: str, schema: StructType, path: str,
                     lines: Iterator[tuple[int, bytes]]) -> Iterator[tuple[Any, ...]]:
    names = schema.fieldNames()
    for offset, line in lines:
        if form == "lines":
            yield (path, offset, line.decode("utf-8", "replace"))
        else:
            values = {**json_record(path, offset, line), "path": path, "offset": offset}
            yield tuple(values.get(name) for name in names)


def reference_rows(form: str, schema: StructType, path: str, lines: Iterator[tuple[int, bytes]]) -> list[tuple]:
    batches = records_to_arrow_batches(reference_tuples(form, schema, path, lines), 10000, schema, _Source)
    return [tuple(row.values()) for batch in batches for row in batch.to_pylist()]


def rows_of(batches: list[pa.RecordBatch], schema: pa.Schema) -> list[tuple]:
    assert all(batch.schema.equals(schema) for batch in batches)
    return [tuple(row.values()) for batch in batches for row in batch.to_pylist()]


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):  # bit for bit: -0.0 is not 0.0
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def assert_same_rows(got: list[tuple], expected: list[tuple]) -> None:
    assert len(got) == len(expected)
    for row, wanted in zip(got, expected, strict=True):
        assert len(row) == len(wanted) and all(map(same_value, row, wanted)), (row, wanted)


def offset_of(error: BaseException) -> int:
    found = re.search(r"at offset (\d+)", str(error))
    assert found, str(error)
    return int(found.group(1))


# ---------------------------------------------------------------------- random data
def random_string(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return "".join(rng.choice("abcxyz ,:{}[]\"\\/\t\né€😀") for _ in range(rng.randint(0, 12)))
    if kind < 0.7:
        return rng.choice(["Info", "level:Inf", "NaN", "-0", "2024-01-01T00:00:00Z", "\u0000", "\ud800", "x:Inf,y"])
    return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 5)))


def random_number(rng: random.Random) -> int | float:
    kind = rng.random()
    if kind < 0.3:
        return rng.randint(-1000, 1000)
    if kind < 0.4:
        return rng.choice([0, -1, 127, 128, -129, 2**31 - 1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63,
                           -(2**63), 2**70, 2**24 + 1])
    if kind < 0.7:
        return rng.uniform(-1e6, 1e6)
    if kind < 0.8:
        return rng.choice([0.0, -0.0, 1e300, 1e-310, 3.4028235677973366e38, 1.5, math.inf, -math.inf, math.nan])
    return float.fromhex(f"0x1.{rng.getrandbits(52):013x}p{rng.randint(-60, 60)}")


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.random()
    if kind < 0.35:
        return random_string(rng)
    if kind < 0.7:
        return random_number(rng)
    if kind < 0.8:
        return rng.random() < 0.5
    if kind < 0.88 or depth > 2:
        return None
    if kind < 0.94:
        return {rng.choice(list(FIELD_KINDS)): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def fitting_value(rng: random.Random, kind: str, clean: bool) -> Any:
    """A value the column takes (most of the time, unless ``clean``: the odd ones are
    what is tested)."""
    if rng.random() < 0.15:
        return None
    if clean and kind in ("double", "float"):
        return rng.choice([rng.uniform(-1e9, 1e9), rng.randint(-1000, 1000), 0.0, -0.0, 1e300])
    return {
        "string": lambda: rng.choice(["u1", "é€", "a\"b\\c", "😀", "", "Info"]),
        "long": lambda: rng.randint(-(2**63), 2**63 - 1) if rng.random() < 0.2 else rng.randint(-1000, 1000),
        "int": lambda: rng.randint(-(2**31), 2**31 - 1),
        "tinyint": lambda: rng.randint(-128, 127),
        "smallint": lambda: rng.randint(-(2**15), 2**15 - 1),
        "double": lambda: random_number(rng) if rng.random() < 0.5 else rng.uniform(-1e9, 1e9),
        "float": lambda: rng.uniform(-1e30, 1e30) if rng.random() < 0.5 else rng.randint(-(2**24), 2**24),
        "boolean": lambda: rng.random() < 0.5,
    }[kind]()


def serialize(rng: random.Random, record: dict[str, Any]) -> bytes:
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,\t", " :\r ")])
    text = json.dumps(record, separators=separators, ensure_ascii=rng.random() < 0.5)
    pad = rng.choice(["", "", " ", "\t", " \r"])
    return (pad + text + rng.choice(["", "", " ", "\t"])).encode("utf-8", "surrogatepass")


def random_json(rng: random.Random, count: int, odd: float, clean: bool = False) -> bytes:
    """JSON lines, ``odd`` of them from ``ODD_LINES``; with ``clean`` only values that
    fit their columns (no line is refused)."""
    fitting = clean or rng.random() < 0.5  # values that fit the columns; else any value anywhere
    lines = []
    for _ in range(count):
        if rng.random() < odd:
            lines.append(rng.choice(ODD_LINES))
        elif fitting:
            record = {k: fitting_value(rng, kind, clean) for k, kind in FIELD_KINDS.items() if rng.random() < 0.8}
            if rng.random() < 0.3:
                record["nested"] = random_value(rng)
            lines.append(serialize(rng, record))
        else:
            lines.append(serialize(rng, {rng.choice([*FIELD_KINDS, "path", "x"]): random_value(rng)
                                         for _ in range(rng.randint(0, 6))}))
    newline = b"\r\n" if rng.random() < 0.1 else b"\n"
    return newline.join(lines) + (newline if rng.random() < 0.5 else b"")


def random_text(rng: random.Random) -> bytes:
    return bytes(rng.choice(b"ab \n\r\xff\xc3\xa9\xe2\x82\xac") for _ in range(rng.randint(0, 400)))


def pieces_of(data: bytes, base: int, rng: random.Random) -> list[tuple[int, bytes]]:
    largest = rng.choice([1, 7, 64, 5000, 1 << 20])
    pieces, position = [], 0
    while position < len(data):
        size = rng.randint(1, largest)
        pieces.append((base + position, data[position : position + size]))
        position += size
    return pieces


# ------------------------------------------------------------ in-process, no daemon
def compare_on(form: str, schema: StructType, data: bytes, rng: random.Random) -> str:
    """Read ``data`` both ways over a random range and random pieces; the outcomes agree."""
    base = rng.randint(0, 1000)
    end, skip = base + rng.randint(0, len(data) + 2), rng.random() < 0.3
    pieces = pieces_of(data, base, rng)
    shape = BatchShape.of(form, schema)
    assert shape is not None
    expected: list[tuple] | BaseException
    try:
        expected = reference_rows(form, schema, "seg/a", split_lines(iter(pieces), end, skip_first=skip))
    except Exception as e:  # the reference's errors: any type; the batches' must be clear
        expected = e
    try:
        blocks = record_blocks(iter(pieces), end, skip_first=skip)
        got = rows_of(list(line_batches(shape, "seg/a", blocks, threads=rng.choice([1, 1, 2, 3]))),
                      shape.arrow_schema)
    except InvalidArgumentError as e:
        assert isinstance(expected, BaseException), f"only the batches failed: {e}"
        if "nested too deeply" in str(expected):
            return "deep"
        if isinstance(expected, InvalidArgumentError) and "which is not a" in str(e):
            # a value that does not fit, in an earlier block than the reference's first
            # bad line (the reference converts 10,000 rows at a time, after parsing them)
            assert offset_of(e) <= offset_of(expected)
            return "error"
        if isinstance(expected, InvalidArgumentError):
            assert str(e) == str(expected)
        return "error"
    if isinstance(expected, BaseException):
        assert "nested too deeply" in str(expected), f"only the reference failed: {expected!r}"
        return "deep"
    assert_same_rows(got, expected)
    return "rows"


def test_batches_equal_the_per_record_rows_on_random_data() -> None:
    rng = random.Random(20261124)
    outcomes: dict[str, int] = {}
    for _ in range(600):
        if rng.random() < 0.2:
            form, schema = "lines", schema_of(LINES_SCHEMA)
            data = random_text(rng) if rng.random() < 0.5 else random_json(rng, rng.randint(0, 40), 0.1)
        else:
            form, schema = "json", schema_of(rng.choice(JSON_SCHEMAS))
            data = random_json(rng, rng.randint(0, 40), rng.choice([0.0, 0.02, 0.1]))
        outcome = compare_on(form, schema, data, rng)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["rows"] > 250 and outcomes["error"] > 100, outcomes


def test_blank_lines_are_rows_of_nulls_and_odd_values_follow_json_loads() -> None:
    schema = schema_of("path string, offset long, user string, n long, score double, f float")
    data = (b'{"user":"a","n":1}\n\n   \r\n\t\n{"user":5,"score":-0}\n{"user":true,"n":-0,"score":Infinity}\n'
            b'{"score":-0.0,"f":0.1}\n{"user":{"k":[1]},"score":9007199254740993.0}')
    shape = BatchShape.of("json", schema)
    assert shape is not None and shape.json is not None
    got = rows_of(list(line_batches(shape, "s", [(100, data)])), shape.arrow_schema)
    expected = reference_rows("json", schema, "s", split_lines([(100, data)], 10**9))
    assert_same_rows(got, expected)
    assert [row[1] for row in got][:4] == [100, 119, 120, 125] and got[1][2:] == (None,) * 4
    assert got[4][2:4] == ("5", None) and same_value(got[4][4], 0.0)  # -0 is the integer 0
    assert got[5][2] == "true" and got[7][2] == "{'k': [1]}"


@pytest.mark.parametrize("line, message", [
    (b'{"a": 1', "not a JSON line"), (b"[1, 2]", "must hold an object"), (b'{"x": Inf}', "not a JSON line"),
    (b'{"a": 1} {"b": 2}', "not a JSON line"), (b'{"a": -NaN, "n": 1}', "not a JSON line"),
    (b'{"n": "seven"}', "field 'n' is 'seven', which is not a bigint"),
    (b'{"n": 99999999999999999999}', "which is not a bigint"),
    (b'{"t": "yesterday"}', "field 't' is 'yesterday', which is not a timestamp"),
])
def test_a_bad_line_is_named_by_its_offset(line: bytes, message: str) -> None:
    schema = schema_of("path string, offset long, n long, t timestamp")
    shape = BatchShape.of("json", schema)
    assert shape is not None
    good = b'{"n": 1, "t": "2024-05-01T10:00:00Z"}\n' * 1000
    with pytest.raises(InvalidArgumentError, match=rf"'seg/x' at offset {len(good) + 7}: .*{re.escape(message)}"):
        list(line_batches(shape, "seg/x", [(7, good + line + b"\n" + good)]))


def test_timestamps_and_not_null_columns() -> None:
    schema = schema_of("t timestamp, n long not null")
    shape = BatchShape.of("json", schema)
    assert shape is not None
    data = (b'{"t":"2024-05-01T10:00:00Z","n":1}\n{"t":"2024-05-01 12:00:00","n":2}\n'
            b'{"t":"2024-05-01T10:00:00+02:00","n":3}\n{"t":null,"n":4}\n')
    fast = rows_of(list(line_batches(shape, "s", [(0, data)])), shape.arrow_schema)
    # a line that sends the block to the per-record parse reads the timestamps the same way
    slow = rows_of(list(line_batches(shape, "s", [(0, data + b'{"n":5.0}\n')])), shape.arrow_schema)
    assert fast == slow[:4] and slow[4][1] == 5
    assert [row[0].isoformat() if row[0] else None for row in fast] == [
        "2024-05-01T10:00:00+00:00", "2024-05-01T12:00:00+00:00", "2024-05-01T08:00:00+00:00", None]
    with pytest.raises(InvalidArgumentError, match=f"offset {len(data)}: field 'n' is missing or null"):
        list(line_batches(shape, "s", [(0, data + b'{"t":null}\n')]))


@pytest.mark.parametrize("ddl", ["value string", "offset long, value string", "value string, path string",
                                 "value string, path string, offset long", "offset long", "p string, o long, v string"])
def test_lines_columns_by_name_are_the_default_rows_projected(ddl: str) -> None:
    rng = random.Random(ddl)
    data = b"".join(random_text(rng) for _ in range(40))
    full = reference_rows("lines", schema_of(LINES_SCHEMA), "seg/a", split_lines([(5, data)], 10**9))
    schema = schema_of(ddl)
    shape = BatchShape.of("lines", schema)
    assert shape is not None
    got = rows_of(list(line_batches(shape, "seg/a", record_blocks([(5, data)], 10**9))), shape.arrow_schema)
    names = schema.fieldNames()
    positions = [0, 1, 2] if names == ["p", "o", "v"] else [["path", "offset", "value"].index(n) for n in names]
    assert_same_rows(got, [tuple(row[i] for i in positions) for row in full])


@pytest.mark.parametrize(("form", "ddl"), [("lines", "value long"), ("lines", "path string, extra string"),
                                           ("lines", "value string, value string"),
                                           ("raw", "path string, offset long, value string"),
                                           ("lines", "a string, b string, c string")])
def test_lines_and_raw_refuse_columns_nothing_can_fill(form: str, ddl: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"format {form} reads the columns path string, offset long"):
        BatchShape.of(form, schema_of(ddl))
    with pytest.raises(InvalidArgumentError, match="reads the columns"):
        TierReader({"path": "tierfs://x", "format": form}, schema_of(ddl))


def test_schemas_the_batches_cannot_build_keep_the_per_record_path() -> None:
    assert BatchShape.of("lines", schema_of(LINES_SCHEMA)) is not None
    assert BatchShape.of("json", schema_of("path long, n long")) is None
    nested = StructType([StructField("tags", StructType([StructField("a", LongType())]))])
    assert BatchShape.of("json", nested) is None


# ------------------------------------------------------------------- through a daemon
@pytest.fixture(scope="module")
def sdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"TIERFS_FLUSH_INTERVAL_S": "3600", "TIERFS_FLUSH_BYTES": str(64 << 20),
           "TIERFS_MAX_CHUNK_BYTES": str(96 * KiB), "TIERFS_MAX_FLUSH_BYTES": str(64 * KiB)}
    running = start_daemon(tmp_path_factory.mktemp("arrow") / "data", env=env)
    yield running
    running.stop()


def write_segment(daemon: Daemon, name: str, data: bytes, rng: random.Random) -> None:
    """Appends cut anywhere, part of them flushed to chunks, the rest in the tail."""
    client = daemon.client()
    try:
        client.create(name, parents=True)
        flushed = rng.randint(0, len(data))
        position = 0
        while position < len(data):
            step = rng.randint(1, 20 * KiB)
            client.append(name, data[position : position + step])
            position += step
            if position >= flushed > position - step:
                client.op("flush", path=name)
    finally:
        client.close()


def expected_rows(form: str, schema: StructType, path: str, data: bytes) -> list[tuple]:
    return reference_rows(form, schema, path, split_lines([(0, data)], len(data)))


def test_partitions_of_a_daemon_segment_equal_the_per_record_rows(sdaemon: Daemon) -> None:
    rng = random.Random(7)
    for round_number in range(6):
        data = random_json(rng, rng.randint(200, 3000), odd=0.0, clean=True)
        if round_number == 0:  # a record longer than the read piece
            data += b'\n{"user":"' + b"x" * (READ_PIECE_BYTES + 1000) + b'"}\n' + data
        name = f"prop/r{round_number}"
        write_segment(sdaemon, name, data, rng)
        for form, ddl in (("lines", LINES_SCHEMA), ("json", JSON_SCHEMAS[0])):
            schema = schema_of(ddl)
            options = {"path": f"tierfs://{name}", "format": form, "data_dir": str(sdaemon.data_dir),
                       "partition_bytes": str(rng.choice([3 * KiB, 16 * KiB, 50 * KiB, 1 << 20])),
                       "parse_threads": str(rng.choice([1, 2, 4]))}
            reader = TierReader(options, schema)
            got = []
            for partition in reader.partitions():
                got += rows_of(list(read_partition(ReadOptions.parse(options), schema, partition)),
                               to_arrow(schema))
            assert_same_rows(sorted(got, key=lambda row: row[1]), expected_rows(form, schema, name, data))


def to_arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# ------------------------------------------------------------------------ through Spark
def test_spark_reads_long_lines_split_records_and_blank_lines(spark: Any, sdaemon: Daemon) -> None:
    rng = random.Random(11)
    events = [json.dumps({"user": f"u{i % 7}", "n": i, "score": i / 4, "ok": i % 3 == 0}).encode()
              for i in range(4000)]
    long_line = json.dumps({"user": "long", "n": -1, "pad": "y" * (READ_PIECE_BYTES + 123)}).encode()
    data = (b"\n".join(events[:2000]) + b"\n\n  \n" + long_line + b"\n" + b"\n".join(events[2000:])
            + b"\n\r\n" + b'{"user":"last","n":-2}')  # a blank line, and a last record without newline
    write_segment(sdaemon, "spark/events", data, rng)
    for form, ddl, threads in (("lines", LINES_SCHEMA, "1"), ("json", JSON_SCHEMAS[0], "2")):
        frame = (spark.read.format("tierfs").option("format", form).option("data_dir", str(sdaemon.data_dir))
                 .option("partition_bytes", str(48 * KiB)).option("parse_threads", threads)
                 .schema(ddl).load("tierfs://spark/events"))
        assert frame.rdd.getNumPartitions() > 10  # records and the long line cross partitions
        got = sorted((tuple(row) for row in frame.collect()), key=lambda row: row[1])
        assert_same_rows(got, expected_rows(form, schema_of(ddl), "spark/events", data))
    blank = [row for row in got if row[2] is None and row[3] is None]
    assert [row[1] for row in blank] == [m.start() + 1 for m in re.finditer(rb"\n(?=\s*\n)", data)]


def test_spark_query_fails_on_a_bad_json_line_naming_its_offset(spark: Any, sdaemon: Daemon) -> None:
    good = b"".join(json.dumps({"user": "u", "n": i}).encode() + b"\n" for i in range(3000))
    data = good + b'{"user": "u", "n": 1,}\n' + good
    write_segment(sdaemon, "spark/bad", data, random.Random(3))
    for threads in ("1", "3"):  # parsed blocks at once: the same first bad line
        frame = (spark.read.format("tierfs").option("format", "json").option("data_dir", str(sdaemon.data_dir))
                 .option("parse_threads", threads).schema("user string, n long").load("tierfs://spark/bad"))
        with pytest.raises(Exception, match=rf"'spark/bad' at offset {len(good)}: not a JSON line"):
            frame.collect()
