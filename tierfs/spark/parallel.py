"""``ordered_map``: one function over a stream of items on a few threads, results in
the stream's order: how a Spark read parses several blocks of records at once
(``parse_threads``). pyarrow's splitting and JSON parsing release the GIL, so a second
thread uses a core the worker would otherwise leave idle.

Invariants:
- Results come in the order of ``items``, one per item; an exception raised by
  ``function`` is raised to the consumer in that item's place, after the results before
  it.
- ``items`` is consumed on the caller's thread only; at most ``threads`` calls run or
  wait at once, so memory is bounded by ``threads`` items and their results plus the
  one the consumer holds.
- A consumer that stops early (closed, or an exception) cancels the calls that have not
  started and waits for the running ones: no thread outlives the generator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def ordered_map(function: Callable[[_Item], _Result], items: Iterable[_Item], threads: int) -> Iterator[_Result]:
    """``function(item)`` for every item, ``threads`` at a time, in order."""
    if threads <= 1:
        yield from map(function, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="tierfs-parse") as pool:
        pending: deque[Future[_Result]] = deque()
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) >= threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
