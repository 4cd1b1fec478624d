"""tierfs's own errors leave the data source's hooks with their message near the top.

Spark runs each hook (``schema``, ``reader``, ``partitions``, ``read``, ``writer``,
``write``, ``commit``, ...) in a Python worker and hands the user the worker's formatted
traceback inside its own message: ``[PYTHON_DATA_SOURCE_ERROR] Failed to ...:
Traceback ...``. A tierfs error (``TierFSError``: no daemon, a name not found, a bad
option) is the user's to act on, not a bug: it leaves the hook with its traceback cut at
the hook, so what the user reads is Spark's prefix, one frame, and tierfs's one line.
(With ``spark.sql.execution.pyspark.udf.hideTraceback.enabled=true`` Spark drops the
frame too; that setting is the user's, since it also hides their own UDFs' tracebacks.)

Invariants:
- Only ``TierFSError`` is cut: any other exception keeps its whole traceback.
- Rows produced lazily (a hook that returns an iterator) are cut the same way as Spark
  pulls them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tierfs.contracts.errors import TierFSError

HOOKS = ("schema", "reader", "streamReader", "writer", "streamWriter", "partitions", "read", "write",
         "commit", "abort", "initialOffset", "latestOffset")
Class = TypeVar("Class", bound=type)


def _rows(rows: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from rows
    except TierFSError as tierfs_error:
        raise tierfs_error.with_traceback(None) from None  # tierfs's message is the next line


def _hook(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def hook(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except TierFSError as tierfs_error:
            raise tierfs_error.with_traceback(None) from None  # tierfs's message is the next line
        return _rows(result) if isinstance(result, Iterator) else result

    return hook


def tierfs_errors(cls: Class) -> Class:
    """Class decorator: the hooks ``cls`` defines itself leave tierfs errors cut."""
    for name in HOOKS:
        method = cls.__dict__.get(name)
        if callable(method) and not isinstance(method, (staticmethod, classmethod)):
            setattr(cls, name, _hook(method))
    return cls
