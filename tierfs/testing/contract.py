"""The chunk-storage contract: checks every ``ChunkStorage`` implementation must pass.

Each check takes an **empty** storage (a fresh directory, bucket prefix or memory
root), drives it through the verbs the engine uses (write, append where supported,
read a range, stat, list, delete) and raises ``ContractViolation`` (an
``AssertionError``) at the first broken promise, naming the call, what it returned and
what the contract requires. ``CHECKS`` lists them all; run them with a test framework
(one test per storage and check: ``tests/test_chunkstore.py``) or without one, with
``check_all(make_storage)``.

What the checks pin down (``tierfs/engine/tier2/chunk_storage.py`` states the guarantees):

- bytes read back are exactly the bytes written, for any range;
- ``stat`` is the stored size; ``list(prefix)`` is sorted and holds only names with
  that prefix; ``delete`` is idempotent;
- ``list_objects`` names every object (nested names too) with its size and a
  modification time close to the write's (orphan collection compares it with a grace
  period);
- a missing chunk raises ``ChunkMissingError`` from ``read`` and ``stat``;
- ``supports_append`` tells the truth: if set, a write at the current end appends and
  a retried append at the same offset replaces the same bytes (never duplicates them);
  if not, a write at an offset > 0 raises ``InvalidArgumentError``;
- ``merge`` builds a new chunk from the leading bytes of others, in order, and leaves
  the sources as they were (natively or not).

Invariant: no check depends on another's leftovers, and none imports pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tierfs.contracts.errors import ChunkMissingError, InvalidArgumentError
from tierfs.engine.tier2.chunk_storage import ChunkStorage


class ContractViolation(AssertionError):
    """A storage broke the chunk-storage contract (the message says where)."""


def _expect_equal(call: str, got: object, expected: object) -> None:
    if got != expected:
        raise ContractViolation(f"{call} returned {got!r}, the contract requires {expected!r}")


def _expect_error(error: type[Exception], call: str, operation: Callable[[], object]) -> None:
    try:
        result = operation()
    except error:
        return
    raise ContractViolation(f"{call} returned {result!r}, the contract requires {error.__name__}")


def check_write_read_stat_list_delete(storage: ChunkStorage) -> None:
    """Whole-chunk writes, ranged reads, stat, sorted prefix lists, idempotent delete,
    and ``ChunkMissingError`` for a chunk that is not there."""
    storage.write("s1/e1-c1", 0, b"0123456789")
    storage.write("s1/e1-c2", 0, b"abc")
    _expect_equal('read("s1/e1-c1", 2, 5)', storage.read("s1/e1-c1", 2, 5), b"234")
    _expect_equal('stat("s1/e1-c1")', storage.stat("s1/e1-c1"), 10)
    _expect_equal('list("s1/")', storage.list("s1/"), ["s1/e1-c1", "s1/e1-c2"])
    storage.delete("s1/e1-c1")
    storage.delete("s1/e1-c1")  # deleting a missing chunk is fine
    _expect_equal("list()", storage.list(), ["s1/e1-c2"])
    _expect_error(ChunkMissingError, 'read("s1/e1-c1", 0, 1) after delete',
                  lambda: storage.read("s1/e1-c1", 0, 1))
    _expect_error(ChunkMissingError, 'stat("nope")', lambda: storage.stat("nope"))


def check_append_capability(storage: ChunkStorage) -> None:
    """``supports_append`` tells the truth, and a retried append lands where the first
    one did."""
    storage.write("c", 0, b"abc")
    if storage.supports_append:
        storage.write("c", 3, b"def")
        storage.write("c", 3, b"DEF")  # a retried append lands at the same place
        _expect_equal('read("c", 0, 6) after appends at 3', storage.read("c", 0, 6), b"abcDEF")
    else:
        _expect_error(InvalidArgumentError, 'write("c", 3, ...) without supports_append',
                      lambda: storage.write("c", 3, b"def"))


def check_list_objects(storage: ChunkStorage) -> None:
    """Every object with its size and an mtime within a minute of the write."""
    before_s = time.time()
    storage.write("s1/e1-c1", 0, b"0123456789")
    storage.write("_owner/claim", 0, b"abc")
    found = sorted(storage.list_objects(), key=lambda o: o.name)
    _expect_equal("list_objects() names and sizes", [(o.name, o.size_bytes) for o in found],
                  [("_owner/claim", 3), ("s1/e1-c1", 10)])
    for obj in found:
        if obj.modified_s is None or abs(obj.modified_s - before_s) > 60:
            raise ContractViolation(
                f"list_objects() gave {obj.name} mtime {obj.modified_s}, written at {before_s:.0f}"
            )
    storage.delete("s1/e1-c1")
    _expect_equal("list_objects() after delete", [o.name for o in storage.list_objects()], ["_owner/claim"])


def check_merge(storage: ChunkStorage) -> None:
    """``merge`` concatenates the first ``length`` bytes of each source into a new
    chunk and changes no source."""
    storage.write("s1/e1-c1", 0, b"0123456789")
    storage.write("s1/e1-c2", 0, b"abcdef")
    storage.merge("s1/e2-c3", [("s1/e1-c1", 4), ("s1/e1-c2", 6), ("s1/e1-c1", 10)])
    _expect_equal('read("s1/e2-c3", 0, 20) after merge', storage.read("s1/e2-c3", 0, 20),
                  b"0123abcdef0123456789")
    _expect_equal('stat("s1/e2-c3")', storage.stat("s1/e2-c3"), 20)
    _expect_equal('read("s1/e1-c1", 0, 10) after merge', storage.read("s1/e1-c1", 0, 10), b"0123456789")
    _expect_equal('read("s1/e1-c2", 0, 6) after merge', storage.read("s1/e1-c2", 0, 6), b"abcdef")


CHECKS: tuple[Callable[[ChunkStorage], None], ...] = (
    check_write_read_stat_list_delete,
    check_append_capability,
    check_list_objects,
    check_merge,
)


def check_all(make_storage: Callable[[], ChunkStorage]) -> None:
    """Run every check, each on a new empty storage from ``make_storage``."""
    for check in CHECKS:
        check(make_storage())
