"""``tierfs.spark.worker_gc.freeze_imports``: the objects alive at a worker's first task
leave the collector's walk, once per process, and garbage made later is still
collected. Each case runs in a child interpreter: freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_first_call_freezes_what_is_alive_and_later_garbage_is_still_collected() -> None:
    out = _run("""
        import gc
        from tierfs.spark.worker_gc import freeze_imports
        before = gc.get_freeze_count()  # 0 on 3.11; 3.12 may start with some frozen
        freeze_imports()
        frozen = gc.get_freeze_count()
        assert frozen > before + 1000, (before, frozen)
        kept = [[] for _ in range(1000)]  # alive after the freeze: not frozen by a second call
        freeze_imports()
        assert gc.get_freeze_count() == frozen
        class Node:
            pass
        for _ in range(100):  # cycles made after the freeze are found by the next collection
            a, b = Node(), Node()
            a.other, b.other = b, a
        del a, b
        print(gc.collect() >= 200, len(kept))
    """)
    assert out == "True 1000"


def test_a_forked_worker_freezes_its_own_objects_once() -> None:
    out = _run("""
        import gc, os
        from tierfs.spark.worker_gc import freeze_imports
        freeze_imports()
        parent = gc.get_freeze_count()
        made = [[] for _ in range(500)]  # lists are always tracked (empty dicts are not)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            freeze_imports()
            child = gc.get_freeze_count()
            freeze_imports()
            os.write(write, f"{child - parent >= 500} {gc.get_freeze_count() == child}".encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 100).decode(), gc.get_freeze_count() == parent, len(made))
    """)
    assert out == "True True True 500"
