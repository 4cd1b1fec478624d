"""Benchmark child processes: ``python -m benchmarks.<module> ...`` in a fresh interpreter
(its memory, caches and GIL its own), answering JSON lines.

Invariants: a child runs this interpreter and finds this package wherever the benchmark
was started from (``child_command`` / ``child_environment``); its stdout carries answers
only, one JSON object per line, its stderr goes to a log file quoted when it fails;
``JsonLineChild.close`` ends it (EOF on stdin, then SIGKILL): it never outlives the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from benchmarks import child_command, child_environment

CLOSE_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 4000


class JsonLineChild:
    """``python -m MODULE ARGS`` answering each JSON request line with one JSON line."""

    def __init__(self, module: str, *args: str, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(child_command(module, *args), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True, env=child_environment(env))

    def send(self, message: Mapping[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        """The child's next line of JSON."""
        assert self.process.stdout is not None
        if not (line := self.process.stdout.readline()):
            log = self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"the child process {self.process.args!r} failed:\n{log}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.answer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """The child's side: answer every request line on stdin with ``handle(request)``."""
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line))), flush=True)
    return 0


def run_once(module: str, *args: str, timeout_s: float = 3600.0) -> dict[str, Any]:
    """``python -m MODULE ARGS`` to its end; the last line it printed, as JSON."""
    done = subprocess.run(child_command(module, *args), env=child_environment(), capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed: {done.stderr[-LOG_TAIL_CHARS:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer
