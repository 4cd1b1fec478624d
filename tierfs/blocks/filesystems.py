"""Opening fsspec filesystems the way tierfs wants them, for the engine and for clients.

Invariant: an S3 filesystem computes and asks for checksums only where the S3 API
requires them (unless the storage options say otherwise): tierfs checks its own CRC32C
of every 1 MiB block on every read, so botocore's CRC32 of every body is the same work
done twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec

# botocore (1.36 and later) adds a CRC32 of every PUT body and asks for response
# checksums by default. Chunks carry their own CRC32C per 1 MiB block, checked on every
# read, so that is the same work done twice on the upload path (and some S3-compatible
# servers reject the new headers). Checksums are asked for only where the S3 API
# requires them, unless the storage options say otherwise.
S3_CHECKSUM_DEFAULTS = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
}


def open_filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs`` with tierfs's defaults for S3 (see above)."""
    options = dict(storage_options or {})
    if fsspec.utils.get_protocol(url) in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        for key, value in S3_CHECKSUM_DEFAULTS.items():
            config.setdefault(key, value)
        options["config_kwargs"] = config
    filesystem, path = fsspec.core.url_to_fs(url, **options)
    return filesystem, str(path)
