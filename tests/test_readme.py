"""README.md and docs/API.md are executed: every shell and Python block, in order, in one
shell with a fresh HOME (so a fresh default data dir), checked against the output the
document shows (a ``text`` block after it). A block the suite cannot run says so in the
document itself (``<!-- not run by the tests: REASON -->``) and is reported as skipped
with that reason. The collector is ``tests/readme_runner.py``.

README.md runs as a newcomer would follow it: from a checkout (here a directory whose
``.venv`` is this interpreter's environment), through the CLI, the engine from Python,
the daemon, fsspec and pandas, the mount, offload to its trial S3 server, Spark and a
restore. docs/API.md's curl examples run against a daemon the test starts on its
default data dir, listening on TCP as the document says. The documents' ports are run
on free ones (``ShellSession.ports``), and a block that fails stops everything its
document started before the next document runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from readme_runner import Block, BlockFailed, ShellSession, blocks, output_matches

from tierfs.testing.harness import start_daemon

REPO = Path(__file__).resolve().parent.parent
BLOCK_TIMEOUT_S = 240.0  # the Spark block starts a JVM; on a loaded 2-core machine that takes a while
README_PORTS = (7070, 9000)  # the README's daemon --listen and its trial S3 server
API_PORT = 7070  # docs/API.md's daemon --listen
DEMO_DIRS = ("/tmp/tierfs-demo", "/tmp/tierfs-demo-tier2")  # "Lost the data dir" uses these

README_BLOCKS = blocks(REPO / "README.md")
API_BLOCKS = blocks(REPO / "docs" / "API.md")
HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


def _environment(home: Path) -> dict[str, str]:
    """The reader's terminal: this machine's environment without tierfs's, AWS's or
    Spark's settings, a fresh HOME, and no virtualenv active yet."""
    dropped = ("TIERFS_", "AWS_", "PYSPARK_", "SPARK_", "VIRTUAL_ENV", "XDG_DATA_HOME", "PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["HOME"] = str(home)
    return env


def _stop_leftovers(home: Path) -> None:
    """What a failed run may leave outside the shell's process group: a mount (its
    daemon is in a session of its own) and a daemon on the default data dir."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(home)):
            subprocess.run(["fusermount3", "-u", "-z", target], capture_output=True)
    lock = home / ".local" / "share" / "tierfs" / "LOCK"
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(lock.read_text().strip()), signal.SIGTERM)


class DocumentRun:
    """One document's shell session, shared by its blocks in order. The first block that
    fails ends the session and what it started (``stop``): the rest are skipped."""

    def __init__(self, session: ShellSession, stop: Callable[[], None]) -> None:
        self.session = session
        self.stop = stop
        self.failed: str | None = None

    def _fail(self, block: Block) -> None:
        self.failed = block.name
        self.stop()

    def run(self, block: Block) -> None:
        if block.skip_reason:
            pytest.skip(f"{block.name}: {block.skip_reason}")
        if self.failed:
            pytest.skip(f"an earlier block failed ({self.failed})")
        try:
            printed = self.session.run(block, BLOCK_TIMEOUT_S)
        except BlockFailed:
            self._fail(block)
            raise
        if block.expected_output is not None and not output_matches(block.expected_output, printed):
            self._fail(block)
            pytest.fail(f"{block.name} printed:\n{printed}\nthe document shows:\n{block.expected_output}")


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentRun]:
    if not HAVE_FUSE:
        pytest.skip("the README's tour mounts: it needs /dev/fuse and fusermount3 (./dev.sh installs fuse3)")
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip(f"the README activates .venv: {sys.prefix} is not a virtualenv")
    home, checkout = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("checkout")
    (checkout / ".venv").symlink_to(venv)  # the checkout a reader runs the README from
    for path in DEMO_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    session = ShellSession(checkout, _environment(home), README_PORTS)

    def stop() -> None:
        session.close()
        _stop_leftovers(home)

    try:
        yield DocumentRun(session, stop)
    finally:
        stop()
        for path in DEMO_DIRS:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentRun]:
    home = tmp_path_factory.mktemp("api-home")
    session = ShellSession(tmp_path_factory.mktemp("api-cwd"), _environment(home), (API_PORT,))
    daemon = start_daemon(home / ".local" / "share" / "tierfs", "--listen", f"127.0.0.1:{session.ports[API_PORT]}",
                          verbose=False)

    def stop() -> None:
        session.close()
        daemon.stop()

    try:
        yield DocumentRun(session, stop)
    finally:
        stop()


@pytest.mark.parametrize("block", README_BLOCKS, ids=[b.name for b in README_BLOCKS])
def test_readme_block(block: Block, readme_run: DocumentRun) -> None:
    if "SparkSession" in block.code and shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (./dev.sh installs one)")
    readme_run.run(block)


@pytest.mark.parametrize("block", API_BLOCKS, ids=[b.name for b in API_BLOCKS])
def test_api_doc_block(block: Block, api_run: DocumentRun) -> None:
    api_run.run(block)


def test_every_block_is_run_or_says_why_not() -> None:
    """The collector sees the blocks: a document's shell and Python blocks are all
    collected, and a skipped one names its reason."""
    for document, found in (("README.md", README_BLOCKS), ("docs/API.md", API_BLOCKS)):
        text = (REPO / document).read_text()
        fences = text.count("```sh\n") + text.count("```bash\n") + text.count("```python\n")
        assert len(found) == fences, f"{document}: {fences} shell/Python blocks, {len(found)} collected"
        assert all(b.skip_reason is None or len(b.skip_reason) > 10 for b in found)
    assert sum(b.skip_reason is None for b in README_BLOCKS) >= 10
    assert any(b.expected_output for b in README_BLOCKS)
