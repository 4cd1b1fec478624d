"""The Spark writer's batch encoding against its per-row reference: random Arrow batches
(strings with quotes, backslashes, control characters and non-ASCII, integers at their
bounds, NaN, infinities and -0.0, timestamps in several local time zones, dates, nulls
everywhere) encode to exactly the bytes of the rows PySpark's worker would hand the
per-row writer; schemas the batches cannot encode keep the per-row writer; and through
Spark, a ``format("tierfs")`` write of such rows equals the rows encoded one by one."""

from __future__ import annotations

import datetime
import json
import math
import random
import struct
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.conversion import ArrowTableToRowsConversion
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    _create_row,
)

from tierfs.spark.write import TierArrowWriter, TierWriter
from tierfs.spark.write_encoding import BatchEncoder, encode_row
from tierfs.testing.harness import Daemon, start_daemon

EPOCH_US_RANGE = (-30_610_224_000 * 10**6, 253_402_300_799 * 10**6)  # years 1000 to 9999
RULES_US_RANGE = (0, 2_145_916_799 * 10**6)  # years 1970 to 2037
SCHEMA = StructType([
    StructField("s", StringType()), StructField("l", LongType()), StructField("i", IntegerType()),
    StructField("h", ShortType()), StructField("b", ByteType()), StructField("ok", BooleanType()),
    StructField("d", DoubleType()), StructField("f", FloatType()), StructField("ts", TimestampType()),
    StructField("day", DateType()), StructField('we"ird\\name é', StringType()),
])


def rows_of(batch: pa.RecordBatch, schema: StructType) -> list[Any]:
    """The rows PySpark's worker hands a per-row ``DataSourceWriter`` for ``batch``."""
    converters = [ArrowTableToRowsConversion._create_converter(f.dataType, binary_as_bytes=True)
                  for f in schema.fields]
    columns = [ArrowTableToRowsConversion._to_pylist(column) for column in batch.columns]
    return [_create_row(schema.fieldNames(), [convert(column[i]) for convert, column in zip(converters, columns, strict=True)])
            for i in range(batch.num_rows)]


def reference(form: str, batch: pa.RecordBatch, schema: StructType) -> bytes:
    return b"".join(encode_row(form, row) for row in rows_of(batch, schema))


def random_string(rng: random.Random) -> str | None:
    kind = rng.random()
    if kind < 0.1:
        return None
    if kind < 0.6:
        return "".join(rng.choice('abc xyz"\\/{}:,') for _ in range(rng.randint(0, 20)))
    alphabet = ['a', '"', '\\', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', '€', '\U0001f600', ' ']
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def random_double(rng: random.Random) -> float | None:
    return rng.choice([None, 0.0, -0.0, 1.0, 0.1, 1e16, 1e-7, 123456789.123, -2.5e-300, 1.7e308,
                       rng.random() * 1000, rng.uniform(-1e20, 1e20)])


def random_batch(rng: random.Random, rows: int, odd_floats: bool, odd_strings: bool) -> pa.RecordBatch:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    strings = [random_string(rng) if odd_strings else maybe(f"u{rng.randrange(10**6)} \"q\" \\") for _ in range(rows)]
    doubles = [random_double(rng) for _ in range(rows)]
    if odd_floats:
        doubles[rng.randrange(rows)] = rng.choice([math.nan, math.inf, -math.inf])
    span = rng.choice([EPOCH_US_RANGE, RULES_US_RANGE])  # any year, or where zones have rules
    micros = [maybe(rng.randint(*span) // rng.choice([1, 10**6])) for _ in range(rows)]
    days = [maybe(datetime.date(1970, 1, 1) + datetime.timedelta(days=rng.randint(-300_000, 2_900_000)))
            for _ in range(rows)]
    arrays = [
        pa.array(strings, pa.string()),
        pa.array([maybe(rng.choice([-(2**63), 2**63 - 1, rng.randrange(-(10**12), 10**12)])) for _ in range(rows)],
                 pa.int64()),
        pa.array([maybe(rng.randrange(-(2**31), 2**31)) for _ in range(rows)], pa.int32()),
        pa.array([maybe(rng.randrange(-(2**15), 2**15)) for _ in range(rows)], pa.int16()),
        pa.array([maybe(rng.randrange(-128, 128)) for _ in range(rows)], pa.int8()),
        pa.array([maybe(rng.random() < 0.5) for _ in range(rows)], pa.bool_()),
        pa.array(doubles, pa.float64()),
        pa.array([None if d is None or math.isnan(d) else d if abs(d) < 3e38 else 1.5 for d in doubles], pa.float32()),
        pa.array(micros, pa.timestamp("us", tz="UTC")),
        pa.array(days, pa.date32()),
        pa.array([maybe("x") for _ in range(rows)], pa.string()),
    ]
    return pa.record_batch(arrays, names=SCHEMA.fieldNames())


@pytest.fixture(params=["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata"])
def local_zone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def test_json_batches_equal_the_rows_encoded_one_by_one(local_zone: str) -> None:
    encoder = BatchEncoder.of("json", SCHEMA)
    assert encoder is not None
    rng = random.Random(local_zone)
    for round_index in range(40):
        batch = random_batch(rng, rng.choice([1, 2, 17, 300]), odd_floats=round_index % 3 == 0,
                             odd_strings=round_index % 2 == 0)
        assert encoder.encode(batch).to_pybytes() == reference("json", batch, SCHEMA)


def test_floats_of_every_magnitude_as_repr_writes_them() -> None:
    """Random bit patterns (every exponent, subnormals, NaN and infinities) as doubles
    and as floats, and the edges of repr's plain notation."""
    rng = random.Random(3)
    doubles = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20_000)]
    doubles += [rng.uniform(-1e7, 1e7) for _ in range(20_000)] + [round(rng.random() * 1000, 3) for _ in range(5000)]
    doubles += [1e-4, -1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 1e15, 0.0, -0.0, 5e-324, None]
    schema = StructType([StructField("d", DoubleType()), StructField("f", FloatType())])
    encoder = BatchEncoder.of("json", schema)
    assert encoder is not None
    floats = [None if d is None or not math.isfinite(d) or abs(d) > 3e38 else d for d in doubles]
    batch = pa.record_batch([pa.array(doubles, pa.float64()), pa.array(floats, pa.float32())], names=["d", "f"])
    assert encoder.encode(batch).to_pybytes() == reference("json", batch, schema)


def test_timestamps_across_daylight_saving_changes(local_zone: str) -> None:
    schema = StructType([StructField("ts", TimestampType())])
    encoder = BatchEncoder.of("json", schema)
    assert encoder is not None
    start = int(datetime.datetime(2026, 3, 28, tzinfo=datetime.UTC).timestamp()) * 10**6
    micros = [start + step * 900 * 10**6 + (step % 3) * 7 for step in range(4 * 24 * 2)]  # 2 days, 15 min
    autumn = int(datetime.datetime(2026, 10, 24, tzinfo=datetime.UTC).timestamp()) * 10**6
    micros += [autumn + step * 900 * 10**6 for step in range(4 * 24 * 2)]
    batch = pa.record_batch([pa.array(micros, pa.timestamp("us", tz="UTC"))], names=["ts"])
    assert encoder.encode(batch).to_pybytes() == reference("json", batch, schema)


def test_lines_and_raw_batches() -> None:
    rng = random.Random(7)
    lines = pa.record_batch([pa.array([random_string(rng) for _ in range(500)], pa.string())], names=["value"])
    lines_schema = StructType([StructField("value", StringType())])
    blobs = pa.record_batch([pa.array([None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 40))
                                       for _ in range(500)], pa.binary())], names=["value"])
    blobs_schema = StructType([StructField("value", BinaryType())])
    for form, batch, schema in (("lines", lines, lines_schema), ("raw", blobs, blobs_schema)):
        encoder = BatchEncoder.of(form, schema)
        assert encoder is not None
        assert encoder.encode(batch).to_pybytes() == reference(form, batch, schema)
        assert encoder.encode(batch.slice(100, 50)).to_pybytes() == reference(form, batch.slice(100, 50), schema)
        assert encoder.encode(batch.slice(0, 0)).to_pybytes() == b""


@pytest.mark.parametrize("schema", [
    StructType([StructField("n", LongType()), StructField("price", DecimalType(10, 2))]),
    StructType([StructField("tags", ArrayType(StringType()))]),
    StructType([StructField("blob", BinaryType())]),
    StructType([StructField("n", LongType()), StructField("n", StringType())]),
])
def test_schemas_the_batches_cannot_encode_keep_the_per_row_writer(schema: StructType) -> None:
    assert BatchEncoder.of("json", schema) is None


@pytest.fixture(scope="module")
def sdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    running = start_daemon(tmp_path_factory.mktemp("encoding") / "data")
    yield running
    running.stop()


def test_spark_writes_batches_as_the_rows_encode_one_by_one(spark: Any, sdaemon: Daemon) -> None:
    rng = random.Random(11)
    batch = random_batch(rng, 3000, odd_floats=True, odd_strings=True)
    frame = spark.createDataFrame(rows_of(batch, SCHEMA), SCHEMA).coalesce(1)
    options = {"data_dir": str(sdaemon.data_dir)}
    assert isinstance(TierWriter.for_schema({**options, "path": "enc/json"}, frame.schema, False), TierArrowWriter)
    frame.write.format("tierfs").mode("append").options(**options).save("tierfs://enc/json")
    client = sdaemon.client()
    try:
        written = client.read("enc/json")
    finally:
        client.close()
    expected = b"".join(encode_row("json", row) for row in frame.collect())
    assert written == expected
    assert len(written.splitlines()) == 3000
    assert json.loads(written.splitlines()[0]).keys() == set(SCHEMA.fieldNames())
