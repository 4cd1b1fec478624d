"""``tierfs.spark.parallel.ordered_map`` (the ``parse_threads`` read option's engine)
and the option's validation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.spark.parallel import ordered_map
from tierfs.spark.read import MAX_PARSE_THREADS, ReadOptions


def slow_square(item: int) -> int:
    time.sleep(0.001 * (item % 3))  # later items often finish first
    return item * item


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_results_keep_the_order_of_the_items(threads: int) -> None:
    assert list(ordered_map(slow_square, range(200), threads)) == [i * i for i in range(200)]


def test_calls_run_at_once_on_threads_and_items_are_read_on_the_callers() -> None:
    running, most, lock = 0, 0, threading.Lock()
    readers: set[str] = set()

    def items() -> Iterator[int]:
        for index in range(40):
            readers.add(threading.current_thread().name)
            yield index

    def work(item: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.005)
        with lock:
            running -= 1
        return item

    assert list(ordered_map(work, items(), 3)) == list(range(40))
    assert most == 3  # never more than the threads asked for, and that many did run at once
    assert readers == {threading.current_thread().name}


def test_an_error_comes_after_the_results_before_it() -> None:
    def fail_at_five(item: int) -> int:
        if item == 5:
            raise ValueError("block 5 is bad")
        return item

    received = []
    with pytest.raises(ValueError, match="block 5 is bad"):
        for result in ordered_map(fail_at_five, range(100), 3):
            received.append(result)
    assert received == [0, 1, 2, 3, 4]


def test_stopping_early_leaves_no_thread_behind() -> None:
    started = []

    def work(item: int) -> int:
        started.append(item)
        time.sleep(0.01)
        return item

    before = threading.active_count()
    results = ordered_map(work, range(10**6), 4)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    results.close()
    assert threading.active_count() == before
    assert len(started) <= 3 + 4  # only what was in flight ran, nothing after the close


@pytest.mark.parametrize("value", ["0", "-1", str(MAX_PARSE_THREADS + 1), "two"])
def test_a_bad_parse_threads_option_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match="parse_threads"):
        ReadOptions.parse({"path": "tierfs://a", "parse_threads": value})


def test_parse_threads_defaults_to_one() -> None:
    assert ReadOptions.parse({"path": "tierfs://a"}).parse_threads == 1
    assert ReadOptions.parse({"path": "tierfs://a", "parse_threads": "4"}).parse_threads == 4
