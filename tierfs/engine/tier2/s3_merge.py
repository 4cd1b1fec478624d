"""Merging chunk objects on S3 into one new object by multipart upload (defrag).

S3 assembles the new object from parts: a source of at least ``MIN_PART_BYTES`` is
copied inside S3 (``UploadPartCopy`` with a byte range, so only its committed bytes,
and no byte passes through tierfs); a run of smaller sources is read and uploaded as
one part, because S3 refuses parts below 5 MiB except the last one (s3fs's ``merge``
copies whole objects only and cannot mix the two, hence the calls here).

Invariants:
- Every part except the last is at least ``MIN_PART_BYTES``; parts are numbered in
  source order, so the object is the sources' bytes in order.
- The object appears only when ``CompleteMultipartUpload`` succeeds; on any failure
  the upload is aborted (best effort), so no partial object is ever visible under the
  new name. Sources are never changed.
- Blocking: runs in the caller's worker thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

MIN_PART_BYTES = 5 << 20  # S3's minimum size of every part but the last


@dataclasses.dataclass(frozen=True)
class Part:
    """One part: ``copy`` names a single source copied inside S3; otherwise the
    ``sources`` are read and their bytes uploaded."""

    sources: tuple[tuple[str, int], ...]
    copy: bool

    @property
    def length(self) -> int:
        return sum(length for _, length in self.sources)


def plan_parts(pieces: Sequence[tuple[str, int]]) -> list[Part]:
    """Parts for ``(source key, length)`` pieces: big pieces are copied, runs of small
    ones uploaded together once they reach ``MIN_PART_BYTES``. A big piece following a
    run still below the minimum joins the run (read, not copied): the run alone would
    be an undersized part."""
    parts: list[Part] = []
    pending: list[tuple[str, int]] = []
    pending_bytes = 0
    for source, length in pieces:
        if length >= MIN_PART_BYTES and not pending:
            parts.append(Part(((source, length),), copy=True))
            continue
        pending.append((source, length))
        pending_bytes += length
        if pending_bytes >= MIN_PART_BYTES:
            parts.append(Part(tuple(pending), copy=False))
            pending, pending_bytes = [], 0
    if pending:
        parts.append(Part(tuple(pending), copy=False))
    return parts


@dataclasses.dataclass(frozen=True)
class MergeCounts:
    """Bytes copied inside the backend, and bytes read and written again by tierfs."""

    copied_natively_bytes: int = 0
    rewritten_bytes: int = 0


def multipart_merge(
    call_s3: Callable[..., Any],
    read: Callable[[str, int], bytes],
    bucket: str,
    key: str,
    pieces: Sequence[tuple[str, int]],
) -> MergeCounts:
    """Create ``bucket/key`` from the first ``length`` bytes of each ``(source key,
    length)`` (sources in the same bucket). ``call_s3(method, **kwargs)`` is s3fs's
    client call; ``read(source key, length)`` reads a source's first bytes."""
    upload = call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    upload_id = upload["UploadId"]
    etags: list[dict[str, Any]] = []
    copied = rewritten = 0
    try:
        for number, part in enumerate(plan_parts(pieces), start=1):
            if part.copy:
                source, length = part.sources[0]
                response = call_s3(
                    "upload_part_copy", Bucket=bucket, Key=key, UploadId=upload_id,
                    PartNumber=number, CopySource=f"{bucket}/{source}",
                    CopySourceRange=f"bytes=0-{length - 1}",
                )
                etag = response["CopyPartResult"]["ETag"]
                copied += length
            else:
                body = b"".join(read(source, length) for source, length in part.sources)
                response = call_s3(
                    "upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                    PartNumber=number, Body=body,
                )
                etag = response["ETag"]
                rewritten += len(body)
            etags.append({"PartNumber": number, "ETag": etag})
        call_s3(
            "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": etags},
        )
    except BaseException:
        try:
            call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception as e:  # the original error matters; the abort is best effort
            log.warning("aborting the multipart upload of %s/%s failed: %s", bucket, key, e)
        raise
    return MergeCounts(copied, rewritten)
