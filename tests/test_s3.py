"""Flushing to an S3-protocol server (moto, server mode, on 127.0.0.1), small chunks."""

from __future__ import annotations

from pathlib import Path

import boto3

from tierfs import open_store
from tierfs.testing.harness import small_config


async def test_flush_to_s3_and_read_back_after_restart(tmp_path: Path, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    url, options = s3_bucket
    config = small_config(tmp_path / "d", tier2_url=url, tier2_options=options, max_chunk_bytes=64 << 10)
    expected = bytearray()
    async with open_store(config) as store:
        assert not store.chunk_storage.supports_append
        await store.mkdir("logs")
        await store.create("logs/s3")
        for i in range(60):
            record = bytes([i]) * 3000
            await store.append("logs/s3", record)
            expected += record
            if i % 20 == 19:
                await store.flush("logs/s3")
        await store.flush()
        layout = await store.chunk_layout("logs/s3")
        assert len(layout) >= 3 and all(c["url"].startswith(url) for c in layout)
        assert (await store.stat("logs/s3")).flushed_length == len(expected)
    bucket = url.split("/")[2]
    client = boto3.client("s3", endpoint_url=options["endpoint_url"], region_name="us-east-1")
    def chunk_keys() -> list[str]:  # not the owner claims (_owner/) nor the metadata backups (_metadata/)
        listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        return [o["Key"] for o in listed if "/_metadata/" not in o["Key"] and "/_owner/" not in o["Key"]]

    keys = chunk_keys()
    assert len(keys) == len(layout)
    assert all("logs" not in key for key in keys), "object keys must come from ids, not names"
    async with open_store(config) as store:
        assert await store.read("logs/s3") == bytes(expected)
        assert await store.read("logs/s3", 5000, 7000) == bytes(expected[5000:12000])
        await store.delete("logs/s3")
        await store.garbage.collect()
    assert chunk_keys() == []  # only the owner claims and metadata backups stay
