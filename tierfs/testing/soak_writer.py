"""One appender of the soak (``testing/soak.py``): a child process that appends
self-checking records to one segment through one front end until that fails, and
prints an acknowledgement line after each append returned.

Usage: ``python -m tierfs.testing.soak_writer KIND WRITER DATA_DIR SEGMENT MOUNTPOINT PID``
with KIND ``fsspec`` (an ``ab`` file, one flush per record, its resends given up after
``FSSPEC_RETRY_BUDGET_S``), ``cli`` (one ``tierfs append`` process per record) or
``fuse`` (``write(2)`` on an ``O_APPEND`` descriptor of the mounted segment). PID is the
daemon's: the CLI writer stops once it is gone, since ``tierfs append`` would otherwise
carry on in-process on the dead daemon's data dir (and stops the ``tierfs append`` still
resending to it).

A record is one line: ``WRITER:SEQ:CRC:PAYLOAD\\n`` where CRC is the CRC32C (8 hex
digits) of ``WRITER:SEQ:PAYLOAD`` and PAYLOAD is 1 to ``MAX_PAYLOAD_CHARS`` hex digits.

Invariants:
- ``ack SEQ`` is printed (and flushed) only after the append of record SEQ returned
  successfully: every printed line is an acknowledged append.
- SEQ counts from 0 with no gaps; the first failure ends the process (exit 0), so the
  writer never retries and never appends a record twice itself.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable

import crc32c

MAX_PAYLOAD_CHARS = 600  # records stay far below one FUSE write and one journal frame
# The daemon comes back only after every writer of the cycle has ended, so a resend can
# only fail: waiting out the client's budget (15 s, for a daemon restart) would just hold
# up each cycle's end. fsspec takes a shorter budget; an in-flight ``tierfs append`` is
# stopped once the daemon is gone (its record stays unacknowledged, as on its failure).
FSSPEC_RETRY_BUDGET_S = 1.0
CLI_TIMEOUT_S = 60.0
CLI_POLL_S = 0.02  # how soon a ``tierfs append`` still resending is stopped once the daemon is gone
RECORD = re.compile(rb"([a-z0-9]+):(\d+):([0-9a-f]{8}):([0-9a-f]+)")


def record(writer: str, seq: int, payload: str) -> bytes:
    body = f"{writer}:{seq}:{payload}".encode()
    return f"{writer}:{seq}:{crc32c.crc32c(body):08x}:{payload}\n".encode()


def parse(line: bytes) -> tuple[str, int] | None:
    """(writer, seq) of a whole, intact record line (without its newline), else None."""
    match = RECORD.fullmatch(line)
    if match is None:
        return None
    writer, seq, crc, payload = match.groups()
    if int(crc, 16) != crc32c.crc32c(writer + b":" + seq + b":" + payload):
        return None
    return writer.decode(), int(seq)


def _appender(kind: str, data_dir: str, segment: str, mountpoint: str, daemon_pid: int) -> Callable[[bytes], None]:
    if kind == "fsspec":
        import fsspec

        fs = fsspec.filesystem("tierfs", data_dir=data_dir, skip_instance_cache=True,
                               retry_budget_s=FSSPEC_RETRY_BUDGET_S)
        file = fs.open(segment, "ab")

        def via_fsspec(data: bytes) -> None:
            file.write(data)
            file.flush()

        return via_fsspec
    if kind == "cli":
        argv = [sys.executable, "-m", "tierfs.cli", "--data-dir", data_dir, "append", segment, "-"]

        def via_cli(data: bytes) -> None:
            os.kill(daemon_pid, 0)  # ProcessLookupError once the daemon is gone
            with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) as append:
                assert append.stdin is not None
                append.stdin.write(data)
                append.stdin.close()
                deadline = time.monotonic() + CLI_TIMEOUT_S
                while True:
                    try:
                        append.wait(timeout=CLI_POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    try:  # its resends cannot reach a dead daemon: stop as the failure would
                        os.kill(daemon_pid, 0)
                        if time.monotonic() > deadline:
                            raise subprocess.TimeoutExpired(argv, CLI_TIMEOUT_S)
                    except BaseException:
                        append.kill()
                        append.wait()
                        raise
            if append.returncode != 0:
                raise subprocess.CalledProcessError(append.returncode, argv)

        return via_cli
    if kind == "fuse":
        fd = os.open(os.path.join(mountpoint, segment), os.O_WRONLY | os.O_APPEND)

        def via_fuse(data: bytes) -> None:
            if os.write(fd, data) != len(data):
                raise OSError("short write")

        return via_fuse
    raise SystemExit(f"unknown writer kind {kind!r}")


def main(argv: list[str]) -> None:
    kind, writer, data_dir, segment, mountpoint, daemon_pid = argv
    rng = random.Random(writer)
    try:
        append = _appender(kind, data_dir, segment, mountpoint, int(daemon_pid))
        seq = 0
        while True:
            payload = rng.randbytes(MAX_PAYLOAD_CHARS // 2).hex()[: rng.randint(1, MAX_PAYLOAD_CHARS)]
            append(record(writer, seq, payload))
            print(f"ack {seq}", flush=True)
            seq += 1
    except Exception as e:  # the daemon was killed under us: that is the test
        print(f"stopped {type(e).__name__}", flush=True)
        os._exit(0)  # no close(): an fsspec file must not resend its buffer


if __name__ == "__main__":
    main(sys.argv[1:])
