"""The cluster trial of docs/several-hosts.md ("Many daemons, one namespace"), run as
written: a throw-away PostgreSQL, two cluster daemons, a write through one and a read
through the other."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "several-hosts.md"


def _trial_block() -> str:
    guide = GUIDE.read_text()
    section = guide[guide.index("## Many daemons, one namespace"):]
    section = section[section.index("as a trial"):]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "no sh block after 'as a trial' in docs/several-hosts.md's 'Many daemons, one namespace'"
    return match.group(1)


def test_the_documented_cluster_trial_runs_as_written(postgres_server: object, tmp_path: Path) -> None:
    del postgres_server  # the suite's server proves PostgreSQL is installed; the trial starts its own
    shutil.rmtree("/tmp/tierfs-trial", ignore_errors=True)
    Path("/tmp/tierfs-pg.url").unlink(missing_ok=True)
    # the block's own last lines stop everything it started: nothing may run after it
    script = ('trap \'kill $(jobs -p) 2>/dev/null || true; wait\' EXIT\nset -e\n' + _trial_block()
              + 'test -z "$(jobs -pr)" || { echo "still running after the trial: $(jobs -r)" >&2; exit 9; }\n')
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    try:  # files, not pipes: PostgreSQL's server processes would hold a pipe open
        with out.open("w") as stdout, err.open("w") as stderr:
            trial = subprocess.Popen(["bash", "-c", script], stdout=stdout, stderr=stderr, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = trial.wait(timeout=240)
            except subprocess.TimeoutExpired:
                code = -1
            finally:  # whatever happened, nothing of the trial outlives the test
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(trial.pid, signal.SIGTERM)
    finally:
        shutil.rmtree("/tmp/tierfs-trial", ignore_errors=True)
        Path("/tmp/tierfs-pg.url").unlink(missing_ok=True)
    assert code == 0, f"exit {code} (-1: still running after 240 s): " + err.read_text()[-3000:]
    assert out.read_text().endswith("written through host a"), out.read_text()[-500:]
    assert "2 live daemons of 2 registered, 4 containers" in out.read_text(), out.read_text()[-2000:]
