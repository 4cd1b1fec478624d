"""Writer identities: how an append is recognised when it is sent again (Kafka's
idempotent producer, Pravega's writer attributes), never by comparing its bytes.

A writer is a random nonzero 64-bit id made once per writing object (a CLI command, an
fsspec file, a forwarding daemon's caller, a Spark task) and a sequence number that
grows by one with each of its appends. An append sent again after a lost answer keeps
its ``WriterSeq``; the owner answers it with the offset of the append already made.

Invariants:
- ``Writer.next()`` never hands out one sequence number twice; 0 is never a writer id
  (0 in a journal frame means "no writer").
- On the wire a writer is 16 lowercase hex digits and its sequence a decimal number;
  anything else is ``InvalidArgumentError`` naming the parameter.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import threading

from tierfs.contracts.errors import InvalidArgumentError

MAX_WRITER_SEQ = (1 << 63) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class WriterSeq:
    """One append's identity: its writer and its number among that writer's appends."""

    writer: int
    seq: int

    def __post_init__(self) -> None:
        if not 0 < self.writer < 1 << 64:
            raise InvalidArgumentError(f"writer must be a nonzero 64-bit id, not {self.writer!r}")
        if not 0 <= self.seq <= MAX_WRITER_SEQ:
            raise InvalidArgumentError(f"writer_seq must be between 0 and {MAX_WRITER_SEQ}, not {self.seq!r}")

    @property
    def writer_hex(self) -> str:
        return f"{self.writer:016x}"

    def query(self) -> dict[str, str]:
        """The HTTP query parameters of this identity."""
        return {"writer": self.writer_hex, "writer_seq": str(self.seq)}

    @classmethod
    def parse(cls, writer: str | None, seq: str | None) -> WriterSeq | None:
        """The identity from the query parameters ``writer`` and ``writer_seq`` (both or
        neither)."""
        if writer is None and seq is None:
            return None
        if writer is None or seq is None:
            raise InvalidArgumentError("query parameters writer and writer_seq go together")
        if len(writer) != 16 or writer.strip("0123456789abcdef"):
            raise InvalidArgumentError(f"query parameter writer must be 16 lowercase hex digits, not {writer!r}")
        if not seq.isdigit():
            raise InvalidArgumentError(f"query parameter writer_seq must be a whole number, not {seq!r}")
        return cls(int(writer, 16), int(seq))

    def __str__(self) -> str:
        return f"writer {self.writer_hex} seq {self.seq}"


class Writer:
    """A writing object's identity: a fresh random id, and its appends' numbers."""

    def __init__(self, writer: int | None = None) -> None:
        self.writer = writer if writer is not None else secrets.randbits(64) or 1
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # one writer may be shared by threads (a client)

    def next(self) -> WriterSeq:
        with self._lock:
            return WriterSeq(self.writer, next(self._numbers))
