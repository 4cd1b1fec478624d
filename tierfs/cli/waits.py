"""What a command that waits says: after ``WAIT_NOTICE_S`` a wait names what it waits
for (``process_line``: the process holding the data dir, as it was typed).

Invariant: imports only the standard library (the parser's and the daemon commands' too).
"""

from __future__ import annotations

from pathlib import Path

WAIT_NOTICE_S = 2.0  # a wait longer than this says what it waits for


def process_line(pid: int) -> str:
    """``pid 123 (tierfs tail -f x)``: its command line, where /proc shows it."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return f"pid {pid}"
    words = [w for w in words if w]
    if "tierfs.cli" in words:  # python -m tierfs.cli ARGS: show it as typed
        words = ["tierfs", *words[words.index("tierfs.cli") + 1:]]
    elif words and words[0].endswith("/tierfs"):
        words[0] = "tierfs"
    return f"pid {pid} ({' '.join(words)[:80]})"
