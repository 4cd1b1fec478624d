"""pandas and pyarrow on tierfs:// URLs through the fsspec plugin and a real daemon."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tierfs.fsspec_impl import TierFileSystem


@pytest.fixture
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({
        "id": np.arange(1000),
        "user": [f"u{i % 17}" for i in range(1000)],
        "amount": rng.normal(size=1000).round(6),
    })


def test_read_csv_and_json_lines(tfs: TierFileSystem, frame: pd.DataFrame) -> None:
    tfs.pipe_file("df/in.csv", frame.to_csv(index=False).encode())
    pd.testing.assert_frame_equal(pd.read_csv("tierfs://df/in.csv"), frame)
    tfs.pipe_file("df/in.jsonl", frame.to_json(orient="records", lines=True).encode())
    pd.testing.assert_frame_equal(pd.read_json("tierfs://df/in.jsonl", lines=True), frame)


def test_write_csv_and_parquet_then_read_back(tfs: TierFileSystem, frame: pd.DataFrame) -> None:
    frame.to_csv("tierfs://df/out.csv", index=False)
    pd.testing.assert_frame_equal(pd.read_csv("tierfs://df/out.csv"), frame)
    frame.to_parquet("tierfs://df/out.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet("tierfs://df/out.parquet"), frame)
    table = pq.read_table("df/out.parquet", filesystem=tfs)
    assert table.equals(pa.Table.from_pandas(frame))
    with pytest.raises(FileExistsError):
        frame.to_csv("tierfs://df/out.csv", index=False)  # never overwritten


def test_parquet_column_read_fetches_little_more_than_it_needs(tfs: TierFileSystem) -> None:
    rng = np.random.default_rng(5)
    rows = 3_000_000  # 24 MB per int64 column: boundary blocks stay small beside it
    table = pa.table({name: rng.integers(0, 1 << 62, rows) for name in ("a", "b", "c", "d")})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="none", row_group_size=rows)
    tfs.pipe_file("df/wide.parquet", buffer.getvalue())
    metadata = pq.ParquetFile(io.BytesIO(buffer.getvalue())).metadata
    column = [metadata.schema.names.index("c")]
    needed = sum(metadata.row_group(g).column(column[0]).total_compressed_size
                 for g in range(metadata.num_row_groups))
    needed += metadata.serialized_size + 8
    before = tfs.bytes_fetched
    got = pd.read_parquet("tierfs://df/wide.parquet", columns=["c"])
    fetched = tfs.bytes_fetched - before
    assert got["c"].to_numpy().tolist()[:10] == table.column("c").to_pylist()[:10]
    assert len(got) == rows
    assert fetched <= 1.2 * needed, f"fetched {fetched} bytes for {needed} needed"
