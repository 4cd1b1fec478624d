"""README.md and the documents in docs/ are executed: every shell and Python block, in
order, in one shell per document with a fresh HOME (so a fresh default data dir), checked
against the output the document shows (a ``text`` block after it). A block the suite
cannot run says so in the document itself (``<!-- not run by the tests: REASON -->``)
and is reported as skipped with that reason. The collector is ``tests/readme_runner.py``.

Each document runs as a reader following it alone would: from a checkout (here a
directory whose ``.venv`` is this interpreter's environment), starting its own daemon,
mount or trial S3 server. README.md is the five-minute tour (the CLI, the engine from
Python, the daemon, fsspec and pandas, the mount); the guides cover the mount and its
tools, fsspec and Spark, operations (offload to a trial S3 server, a restore) and
several hosts (whose cluster trial ``tests/test_readme_cluster.py`` runs). docs/API.md's
curl examples run against a daemon the test starts on the default data dir, listening
on TCP as the document says. The documents' ports are run on free ones
(``ShellSession.ports``), and a block that fails stops everything its document started;
each document's session ends before the next one starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


@dataclasses.dataclass(frozen=True)
class Document:
    path: str  # relative to the repository
    min_run: int  # at least this many of its blocks are run (not marked "not run")
    ports: tuple[int, ...] = ()  # the TCP ports its text names (run on free ones)
    mounts: bool = False  # it mounts: needs /dev/fuse and fusermount3
    scratch: tuple[str, ...] = ()  # fixed paths its blocks use, removed before and after
    serve_on: int | None = None  # the test starts a daemon listening on this port (docs/API.md)

    @property
    def blocks(self) -> list[Block]:
        return blocks(REPO / self.path)


DOCUMENTS = (
    Document("README.md", min_run=6, mounts=True),
    Document("docs/mount.md", min_run=4, mounts=True),
    Document("docs/fsspec-and-spark.md", min_run=4),
    Document("docs/operations.md", min_run=4, ports=(9000,),  # its trial S3 server
             scratch=("/tmp/tierfs-demo", "/tmp/tierfs-demo-tier2")),  # "Lost the data dir"
    Document("docs/several-hosts.md", min_run=0),  # its cluster trial: tests/test_readme_cluster.py
    Document("docs/API.md", min_run=2, ports=(7070,), serve_on=7070),
)
CASES = [(document, block) for document in DOCUMENTS for block in document.blocks]


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


def _why_not(document: Document) -> str | None:
    """Why this machine cannot run the document, if it cannot."""
    if document.mounts and not HAVE_FUSE:
        return f"{document.path} mounts: it needs /dev/fuse and fusermount3 (./dev.sh installs fuse3)"
    if document.serve_on is None and not (Path(sys.prefix) / "bin" / "activate").exists():
        return f"{document.path} activates .venv: {sys.prefix} is not a virtualenv"
    return None


class DocumentRuns:
    """The run of the document whose blocks are being tested; starting the next
    document's run stops the previous one (its daemons, mounts and trial servers)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.document: Document | None = None
        self.current: DocumentRun | None = None

    def run(self, document: Document, block: Block) -> None:
        if document != self.document:
            self.close()
            self.document = document
            self.current = self._start(document)
        assert self.current is not None
        self.current.run(block)

    def _start(self, document: Document) -> DocumentRun:
        name = Path(document.path).stem.lower()
        home = self.tmp_path_factory.mktemp(f"{name}-home")
        checkout = self.tmp_path_factory.mktemp(f"{name}-checkout")
        (checkout / ".venv").symlink_to(Path(sys.prefix))  # the checkout a reader runs the document from
        for path in document.scratch:
            shutil.rmtree(path, ignore_errors=True)
        session = ShellSession(checkout, _environment(home), document.ports)
        daemon = None
        if document.serve_on is not None:
            port = session.ports[document.serve_on]
            daemon = start_daemon(home / ".local" / "share" / "tierfs", "--listen", f"127.0.0.1:{port}",
                                  verbose=False)

        def stop() -> None:
            session.close()
            if daemon is not None:
                daemon.stop()
            _stop_leftovers(home)
            for path in document.scratch:
                shutil.rmtree(path, ignore_errors=True)

        return DocumentRun(session, stop)

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current = None


@pytest.fixture(scope="module")
def document_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentRuns]:
    runs = DocumentRuns(tmp_path_factory)
    try:
        yield runs
    finally:
        runs.close()


@pytest.mark.parametrize(("document", "block"), CASES, ids=[block.name for _, block in CASES])
def test_document_block(document: Document, block: Block, document_runs: DocumentRuns) -> None:
    if block.skip_reason:
        pytest.skip(f"{block.name}: {block.skip_reason}")
    why_not = _why_not(document)
    if why_not:
        pytest.skip(why_not)
    if "SparkSession" in block.code and shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (./dev.sh installs one)")
    document_runs.run(document, block)


def test_every_block_is_run_or_says_why_not() -> None:
    """The collector sees the blocks: every document's shell and Python blocks are all
    collected, a skipped one names its reason, each document runs enough of its own
    blocks to stand alone, and the README links every guide."""
    readme = (REPO / "README.md").read_text()
    for document in DOCUMENTS:
        text = (REPO / document.path).read_text()
        found = document.blocks
        fences = text.count("```sh\n") + text.count("```bash\n") + text.count("```python\n")
        assert len(found) == fences, f"{document.path}: {fences} shell/Python blocks, {len(found)} collected"
        assert all(b.skip_reason is None or len(b.skip_reason) > 10 for b in found)
        run = sum(b.skip_reason is None for b in found)
        assert run >= document.min_run, f"{document.path}: {run} blocks run, fewer than {document.min_run}"
        if document.path != "README.md":
            assert f"]({document.path})" in readme, f"README.md does not link {document.path}"
    guides = {path.relative_to(REPO).as_posix() for path in (REPO / "docs").glob("*.md")}
    tested = {document.path for document in DOCUMENTS}
    with_blocks = {guide for guide in guides if "```sh\n" in (REPO / guide).read_text()
                   or "```python\n" in (REPO / guide).read_text()}
    assert with_blocks <= tested, f"documents whose blocks no test runs: {sorted(with_blocks - tested)}"
    assert any(b.expected_output for b in DOCUMENTS[0].blocks)
    several = next(d for d in DOCUMENTS if d.path == "docs/several-hosts.md")
    assert any("tests/test_readme_cluster.py" in (b.skip_reason or "") for b in several.blocks)
