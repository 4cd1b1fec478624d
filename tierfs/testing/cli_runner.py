"""The ``tierfs`` command run inside the calling process, for tests of what a command does.

A test of a command's output and exit code needs the command, not a new interpreter: a
process costs ~0.3 CPU-s of start-up and imports, an in-process call a few milliseconds.

Invariants:
- The command is the console script's own: ``tierfs.cli.parser.run(argv)``, so parsing,
  the one place a failure becomes an exit code and a line (``cli/execution.py``) and every
  command's output are what a user's process runs. Usage errors and ``--help`` end in
  ``SystemExit``, as in the process; its code is the exit code.
- stdin, stdout and stderr are byte buffers for the call (text written through to them in
  order); the command's log lines go to its stderr as in a process (execute() configures
  logging only for a root logger without handlers, so the caller's handlers are set aside
  for the call). ``os.environ``, the working directory and the logging state are restored
  after it, whatever the command did.
- What only a process shows is not seen here, and tests of it run ``python -m tierfs.cli``:
  the entry script and interpreter start-up, signals, a reader closing the pipe early,
  locks held between processes (a store the caller has open is the same process), file
  descriptors written directly, and a command that hangs (there is no timeout).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None, cwd: Path | str | None) -> Iterator[None]:
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _standard_streams(stdin: bytes) -> Iterator[tuple[io.BytesIO, io.BytesIO]]:
    out, err = io.BytesIO(), io.BytesIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    streams = (io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors="surrogateescape"),
               io.TextIOWrapper(out, encoding="utf-8", write_through=True),
               io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True))
    sys.stdin, sys.stdout, sys.stderr = streams
    root.handlers = []
    try:
        yield out, err
    finally:
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers, root.level = saved_handlers, saved_level
        sys.stdin, sys.stdout, sys.stderr = saved
        for stream in streams:  # detached: a wrapper's end would close the buffers read after
            stream.flush()
            stream.detach()


def run_tierfs(*args: str, stdin: bytes | str = b"", env: Mapping[str, str] | None = None,
               cwd: Path | str | None = None) -> subprocess.CompletedProcess[bytes]:
    """``tierfs ARGS`` in this process: its exit code and its stdout and stderr bytes."""
    from tierfs.cli.parser import run

    data = stdin.encode() if isinstance(stdin, str) else stdin
    with _environment(env, cwd), _standard_streams(data) as (out, err):
        try:
            code = run(list(args))
        except SystemExit as exit_:
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
            code = 1 if isinstance(exit_.code, str) else int(exit_.code or 0)
    return subprocess.CompletedProcess(["tierfs", *args], code, out.getvalue(), err.getvalue())


def run_tierfs_text(*args: str, stdin: str = "", env: Mapping[str, str] | None = None,
                    cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`run_tierfs` with stdout and stderr decoded, as ``subprocess.run(text=True)``."""
    done = run_tierfs(*args, stdin=stdin, env=env, cwd=cwd)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))
