"""Exactly-once writes: ``df.write.format("tierfs").mode("append").save("tierfs://out/r")``
and ``df.writeStream.format("tierfs")`` (Pravega's transactions over segments).

Each task attempt writes its rows into its own transaction segment under
``<target's directory>/_tierfs_tx/<target name>-<writer id>/`` (VD appends, then one
sync covers them all), seals it, and
reports its name to the driver. The job commit appends the reported segments, in
partition order, to the target with one metadata-only ``concat`` (one metadata
transaction, no byte copied), then deletes what failed or speculative attempts left
behind. An abort deletes the job's transaction segments. A batch job then leaves a
tombstone (see ``TierWriter``) so that attempts still running cannot add segments. Rows are written as JSON lines
(``format`` ``json``, default), as one string column per line (``lines``) or as the
bytes of one binary column (``raw``), encoded by ``write_encoding``: whole Arrow record
batches at once where it can encode the schema (``TierArrowWriter``,
``TierStreamArrowWriter``: PySpark hands them the batches instead of a Row per row),
else row by row; both write the same bytes.

Invariants:
- Rows reach the target only through the commit's single concat: a failed, retried or
  speculative task attempt, or an aborted job, adds nothing to it.
- A streaming batch commits with writer mark ``(writer id, batch id)``; the target
  remembers the highest batch committed per writer, so a batch replayed after a driver
  crash is refused by the engine (``already_committed``) and its segments deleted:
  every batch lands exactly once. The writer id is the ``writer_id`` option, or derived
  from the query's checkpoint location.
- The target is append-only: ``mode("overwrite")`` is refused before any task runs.
- A task's appends go out in order from one thread while it encodes the next rows,
  and one refused for a full backlog is sent again (``appends``): each byte lands once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from tierfs.contracts.errors import (
    AlreadyCommittedError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    NotADirectoryError_,
    SegmentExistsError,
    SegmentNotFoundError,
    TierFSError,
)
from tierfs.contracts.names import basename, canonical, parent_of
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.remote.client import TierClient, discover_url
from tierfs.spark.appends import PipelinedAppends, task_client
from tierfs.spark.hook_errors import tierfs_errors
from tierfs.spark.read import strip_scheme
from tierfs.spark.worker_gc import freeze_imports
from tierfs.spark.write_encoding import WRITE_FORMATS, BatchEncoder, encode_row

TX_DIRECTORY = "_tierfs_tx"
APPEND_BUFFER_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class TierCommitMessage(WriterCommitMessage):
    partition: int
    segment: str | None  # None: the task had no rows
    rows: int
    bytes: int


@tierfs_errors
class _TierWriterBase:
    """What the batch and the streaming writer share: options, encoding, task writes,
    commit and clean-up."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool, writer_id: str) -> None:
        if overwrite:
            raise InvalidArgumentError("tierfs segments are append-only: use mode('append')")
        self.options = dict(options)
        self.target = canonical(strip_scheme(options.get("path", "")))
        self.format = options.get("format", "json")
        if self.format not in WRITE_FORMATS:
            raise InvalidArgumentError(f"format must be one of {WRITE_FORMATS}, not {self.format!r}")
        wanted = {"lines": StringType(), "raw": BinaryType()}.get(self.format)
        if wanted is not None and [f.dataType for f in schema.fields] != [wanted]:
            raise InvalidArgumentError(
                f"format {self.format} writes exactly one {wanted.simpleString()} column; the data has {schema.simpleString()}"
            )
        self.schema = schema
        self.writer_id = writer_id
        self.tx_root = "/".join(filter(None, (parent_of(self.target), TX_DIRECTORY)))
        self.tx_dir = f"{self.tx_root}/{basename(self.target)}-{writer_id}"
        client = self.client()
        try:  # the target exists and can take appends before any task runs
            try:
                info = client.stat(self.target)
            except SegmentNotFoundError:
                info = client.create(self.target, parents=True)
            if not isinstance(info, SegmentInfo):
                raise InvalidArgumentError(f"{self.target!r} is a directory; write to a segment inside it")
            if info.sealed:
                raise InvalidArgumentError(f"{self.target!r} is sealed; unseal it to append")
        finally:
            client.close()

    def client(self) -> TierClient:
        url = self.options.get("url") or discover_url(self.options.get("data_dir") or None)
        return TierClient(url, self.options.get("token"))

    def task_client(self) -> TierClient:
        """This worker's client of the daemon, kept for its next tasks (``appends``);
        never closed by a task."""
        url = self.options.get("url") or discover_url(self.options.get("data_dir") or None)
        return task_client(url, self.options.get("token"))

    def write(self, iterator: Iterator[Row]) -> TierCommitMessage:
        """Spark rows, one by one (``encode_row``)."""
        return self._write_encoded((1, encode_row(self.format, row)) for row in iterator)

    def _write_batches(self, batches: Iterable[pa.RecordBatch]) -> TierCommitMessage:
        """Arrow record batches, each encoded at once (``BatchEncoder``)."""
        encoder = BatchEncoder.of(self.format, self.schema)
        if encoder is None:
            raise InvalidArgumentError(f"no batch encoding for {self.schema.simpleString()}")
        return self._write_encoded((batch.num_rows, encoder.encode(batch)) for batch in batches)

    def _write_encoded(self, pieces: Iterable[tuple[int, Any]]) -> TierCommitMessage:
        """Append (rows, encoded bytes) pieces to this attempt's transaction segment in
        appends of ``APPEND_BUFFER_BYTES``; sync and seal it; report it."""
        freeze_imports()
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.taskAttemptId() if context else 0
        name = f"{self.tx_dir}/p{partition:06d}-t{attempt}-{uuid.uuid4().hex[:8]}"
        client = self.task_client()
        appends = PipelinedAppends(client, name)
        rows = 0
        buffer = bytearray()
        try:
            for count, data in pieces:
                rows += count
                view = memoryview(data)
                while len(view) >= APPEND_BUFFER_BYTES - len(buffer):
                    room = APPEND_BUFFER_BYTES - len(buffer)
                    buffer += view[:room]
                    view = view[room:]
                    appends.send(bytes(buffer))
                    buffer.clear()
                buffer += view
            if buffer:
                appends.send(bytes(buffer))
            if not appends.finish():
                return TierCommitMessage(partition, None, rows, 0)
            client.op("sync", path=name)  # the VD appends are durable before the seal
            client.op("seal", path=name)
            return TierCommitMessage(partition, name, rows, appends.sent_bytes)
        finally:
            appends.stop()  # after a failure: what was not sent is dropped

    def _commit(self, messages: list[WriterCommitMessage | None], writer_seq: int | None) -> None:
        mine = sorted((m for m in messages if isinstance(m, TierCommitMessage) and m.segment),
                      key=lambda m: m.partition)
        client = self.client()
        try:
            if mine:
                sources = [m.segment for m in mine]
                mark = {} if writer_seq is None else {"writer": self.writer_id, "writer_seq": writer_seq}
                try:
                    client.op("concat", target=self.target, sources=sources, **mark)
                except AlreadyCommittedError:
                    pass  # a replayed batch: it is in the target already; its copies go below
            self._clean_up(client)
        finally:
            client.close()

    def _abort(self) -> None:
        client = self.client()
        try:
            self._clean_up(client)
        finally:
            client.close()

    def _clean_up(self, client: TierClient) -> None:
        """Delete every transaction segment of this writer that is still there (failed
        or speculative attempts, an aborted job), then the empty directories."""
        self._delete_transactions(client)
        for directory in (self.tx_dir, self.tx_root):
            try:
                client.op("rmdir", path=directory)
            except TierFSError:
                break  # another job's segments are still there

    def _delete_transactions(self, client: TierClient) -> None:
        try:
            leftovers = client.ls(self.tx_dir)
        except (SegmentNotFoundError, NotADirectoryError_):
            return
        for entry in leftovers:
            try:
                client.delete(entry.name)
            except SegmentNotFoundError:
                pass


@tierfs_errors
class TierWriter(_TierWriterBase, DataSourceWriter):
    """``df.write.format("tierfs").mode("append")``: one job, one transaction.

    Spark may still be running (killed, or speculative) task attempts when it calls
    ``commit`` or ``abort``. So both end by replacing the job's transaction directory
    with a *tombstone*: an empty sealed segment of the same name, under which no late
    attempt can create its segment (and one created just before had its segment
    deleted, so its appends fail). Tombstones older than ``TOMBSTONE_TTL_S`` are swept
    by later jobs writing next to the same target."""

    TOMBSTONE_TTL_S = 3600.0

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite, uuid.uuid4().hex[:16])

    @staticmethod
    def for_schema(options: dict[str, str], schema: StructType, overwrite: bool) -> TierWriter:
        """``TierArrowWriter`` when ``BatchEncoder`` can encode the schema, else this."""
        writer = TierWriter(options, schema, overwrite)
        if BatchEncoder.of(writer.format, schema) is None:
            return writer
        return TierArrowWriter(options, schema, overwrite)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort()

    def _clean_up(self, client: TierClient) -> None:
        for _ in range(100):  # each round loses only to an attempt that created meanwhile
            self._delete_transactions(client)
            try:
                client.op("rmdir", path=self.tx_dir)
            except (SegmentNotFoundError, NotADirectoryError_):
                pass
            except DirectoryNotEmptyError:
                continue
            try:
                client.create(self.tx_dir, durability="vd", parents=True)
                client.op("seal", path=self.tx_dir)
                break
            except SegmentExistsError:
                continue  # a late attempt re-created the directory
        self._sweep_tombstones(client)

    def _sweep_tombstones(self, client: TierClient) -> None:
        prefix = f"{self.tx_root}/{basename(self.target)}-"
        try:
            entries = client.ls(self.tx_root)
        except (SegmentNotFoundError, NotADirectoryError_):
            return
        now = time.time()
        for entry in entries:
            if (isinstance(entry, SegmentInfo) and entry.name.startswith(prefix) and entry.sealed
                    and entry.length == 0 and now - entry.modified >= self.TOMBSTONE_TTL_S):
                try:
                    client.delete(entry.name)
                except SegmentNotFoundError:
                    pass
        try:
            client.op("rmdir", path=self.tx_root)
        except TierFSError:
            pass  # tombstones younger than the TTL, or another job's transactions


@tierfs_errors
class TierArrowWriter(TierWriter, DataSourceArrowWriter):
    """``TierWriter`` fed Arrow record batches (PySpark passes a ``DataSourceArrowWriter``
    the batches it would otherwise turn into rows): each batch encoded at once."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TierCommitMessage:
        return self._write_batches(iterator)


@tierfs_errors
class TierStreamWriter(_TierWriterBase, DataSourceStreamWriter):
    """``df.writeStream.format("tierfs")``: one transaction per micro-batch, deduplicated
    by batch id."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite, stream_writer_id(options))

    @staticmethod
    def for_schema(options: dict[str, str], schema: StructType, overwrite: bool) -> TierStreamWriter:
        """``TierStreamArrowWriter`` when ``BatchEncoder`` can encode the schema, else this."""
        writer = TierStreamWriter(options, schema, overwrite)
        if BatchEncoder.of(writer.format, schema) is None:
            return writer
        return TierStreamArrowWriter(options, schema, overwrite)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort()


@tierfs_errors
class TierStreamArrowWriter(TierStreamWriter, DataSourceStreamArrowWriter):
    """``TierStreamWriter`` fed Arrow record batches (see ``TierArrowWriter``)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TierCommitMessage:
        return self._write_batches(iterator)


def stream_writer_id(options: dict[str, str]) -> str:
    """The ``writer_id`` option, else one derived from the checkpoint location (so a
    restarted query keeps it), else a new one (no checkpoint: nothing to resume)."""
    if options.get("writer_id"):
        return canonical(options["writer_id"]).replace("/", "-")
    checkpoint = options.get("checkpointLocation") or options.get("checkpointlocation")
    if checkpoint:
        return "q" + hashlib.sha256(checkpoint.encode()).hexdigest()[:16]
    return "q" + uuid.uuid4().hex[:16]
