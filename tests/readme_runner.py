"""Runs the code blocks of a Markdown file as a reader would type them into one terminal.

- ``blocks(path)``: every fenced block tagged ``sh``/``bash`` or ``python``, in order,
  with the output it claims (a ``text`` block right after it: compared with what the
  block printed on stdout, ``...`` matching any text) and why it is not run, if it is
  not (an HTML comment right before the fence: ``<!-- not run by the tests: REASON -->``).
- ``ShellSession``: one bash process for a whole file, as one terminal: shell blocks are
  sourced into it (aliases, ``cd``, ``export`` and background jobs carry over to later
  blocks), Python blocks run with the ``python`` on its PATH in its directory and
  environment. A block fails if any of its commands fails (an ``ERR`` trap records it)
  or if it ends with a non-zero status. Its fresh ``HOME`` is the reader's.
- ``ports``: the TCP ports a document names are run on free ports of this machine
  instead (``127.0.0.1:7070`` in the text, a free port in the shell), and what a block
  prints shows the document's ports again: a busy port never fails a block.

Nothing here knows tierfs: it is the test suite's Markdown collector.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"sh": "sh", "bash": "sh", "python": "python"}
SKIP_MARK = re.compile(r"<!--\s*not run by the tests:\s*(.*?)\s*-->\s*$", re.S)
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
DONE = "__README_BLOCK_DONE__"
POLL_S = 0.05
STOP_TIMEOUT_S = 30.0  # background daemons flush before they exit


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Block:
    path: Path
    line: int
    kind: str  # "sh" or "python"
    code: str
    skip_reason: str | None = None
    expected_output: str | None = None

    @property
    def name(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found: list[Block] = []
    previous_end = 0
    for match in FENCE.finditer(text):
        tag, code = match.group(1).lower(), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        between = text[previous_end:match.start()]
        previous_end = match.end()
        if tag == "text" and found and not between.strip(" \t\n").count("```"):
            if found[-1].expected_output is None and found[-1].line < line:
                found[-1].expected_output = code
            continue
        if tag not in RUNNABLE:
            continue
        skip = SKIP_MARK.search(between.rstrip())
        found.append(Block(path, line, RUNNABLE[tag], code, skip.group(1) if skip else None))
    return found


def output_matches(expected: str, actual: str) -> bool:
    """``expected`` with ``...`` matching any text (lines compared without trailing blanks)."""
    def tidy(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())

    pattern = ".*?".join(re.escape(piece) for piece in tidy(expected).split("..."))
    return re.fullmatch(pattern, tidy(actual), re.S) is not None


class BlockFailed(AssertionError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ShellSession:
    """One bash for a whole Markdown file (see the module docstring)."""

    def __init__(self, workdir: Path, env: dict[str, str], ports: tuple[int, ...] = ()) -> None:
        self.workdir = workdir
        self.ports = {port: free_port() for port in ports}
        self._closed = False
        self._stdout_path, self._stderr_path = workdir / ".readme-stdout", workdir / ".readme-stderr"
        self._stdout = self._stdout_path.open("w+b")
        self._stderr = self._stderr_path.open("w+b")
        self._count = 0
        # files, not pipes: background jobs keep them open and nobody must have to read them
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                                     stdout=self._stdout, stderr=self._stderr, cwd=workdir, env=env,
                                     start_new_session=True)
        self._send("shopt -s expand_aliases\n"
                   "trap '__readme_failed=\"$__readme_failed line $LINENO: exit $?: $BASH_COMMAND;\"' ERR\n")

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def _read(self, path: Path, start: int) -> str:
        return path.read_bytes()[start:].decode(errors="replace")

    def run(self, block: Block, timeout_s: float) -> str:
        """Run ``block``; its stdout. ``BlockFailed`` (with its stderr) if it failed."""
        self._count += 1
        suffix = ".sh" if block.kind == "sh" else ".py"
        script = self.workdir / f".readme-block-{self._count}{suffix}"
        script.write_text(self.to_machine(block.code))
        command = f"source {script}" if block.kind == "sh" else f"python {script}"
        out_start, err_start = self._stdout_path.stat().st_size, self._stderr_path.stat().st_size
        self._send(f"__readme_failed=\n{command} < /dev/null\n__readme_status=$?\n"
                   f"echo; echo \"{DONE} $__readme_status $__readme_failed\"\n")
        deadline = time.monotonic() + timeout_s
        while True:
            out = self._read(self._stdout_path, out_start)
            if DONE in out:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.to_document(self._read(self._stderr_path, err_start))
                state = "the shell exited" if self.proc.poll() is not None else f"still running after {timeout_s:g} s"
                raise BlockFailed(f"{block.name}: {state}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
            time.sleep(POLL_S)
        out = self.to_document(out)
        printed, _, tail = out.partition(DONE)
        status, _, failures = tail.strip().partition(" ")
        printed = printed[:-1] if printed.endswith("\n") else printed  # the echo before the marker
        if status != "0" or failures.strip():
            err = self.to_document(self._read(self._stderr_path, err_start))
            raise BlockFailed(f"{block.name}: exit {status}; failed: {failures.strip() or '-'}\n"
                              f"stdout:\n{printed[-3000:]}\nstderr:\n{err[-3000:]}")
        return printed

    def to_machine(self, text: str) -> str:
        """``text`` with the document's ports replaced by the free ones this session uses."""
        for document_port, port in self.ports.items():
            text = re.sub(rf"(?<![0-9]){document_port}(?![0-9])", str(port), text)
        return text

    def to_document(self, text: str) -> str:
        for document_port, port in self.ports.items():
            text = re.sub(rf"(?<![0-9]){port}(?![0-9])", str(document_port), text)
        return text

    def stderr_since_start(self) -> str:
        return self.to_document(self._read(self._stderr_path, 0))

    def close(self) -> None:
        """End the shell and everything it started in its session (background jobs)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, ValueError):
            self._send("exit\n")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # daemons flush and exit on SIGTERM
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            self.proc.poll()  # reap the shell, so only what it started keeps the group alive
            time.sleep(POLL_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stdout.close()
        self._stderr.close()
