"""Benchmark child processes that answer one JSON line with one JSON line.

Some measurements must run in another process: a fresh interpreter whose peak RSS and
block cache are its own (``read``'s cold scan), or a second process reading through
fsspec while this one runs the engine (``fsspec``). Such a child is ``python -m
benchmarks.<module> <flag>``; it reads a request from stdin, one JSON object per line,
and prints exactly one JSON object per line on stdout for each (a child may also print
one line of its own first, e.g. "ready", which the parent reads with ``answer()``).

Invariants:

- The child runs the same interpreter and finds this package wherever the benchmark
  was started from (``child_command`` / ``child_environment``).
- Its stderr goes to ``log_path``, quoted when it fails; stdout carries answers only.
- ``close()`` ends it (EOF on stdin, then SIGKILL after ``CLOSE_TIMEOUT_S``): it never
  outlives the benchmark.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks import child_command, child_environment

CLOSE_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 4000


class ChildFailed(RuntimeError):
    """The child process ended without answering (the message quotes its stderr)."""


class JsonLineChild:
    """``python -m MODULE FLAG`` answering JSON lines (see the module docstring)."""

    def __init__(self, module: str, flag: str, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self._log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                child_command(module, flag),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                env=child_environment(env),
            )

    def answer(self) -> dict[str, Any]:
        """The child's next line of JSON."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            log = self._log_path.read_text(errors="replace")
            raise ChildFailed(f"the child process {self.process.args!r} failed:\n{log[-LOG_TAIL_CHARS:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request line; its answer line."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
