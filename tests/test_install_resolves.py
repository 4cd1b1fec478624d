"""`pip install -e '.[test]'` resolves quickly with the pip a fresh Python 3.11 venv
ships (23.x) and with a current pip (issue 17 item 8): the S3 client stack is pinned
as one tested set in setup.py, so neither pip backtracks or gives up.

This resolves against the package index (``--dry-run``: nothing is installed).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESOLVE_TIMEOUT_S = 240  # far above the ~10-30 s both take; a backtracking pip takes minutes


def _pip(python: Path, *args: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO)


def _resolves(python: Path) -> None:
    result = _pip(python, "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check",
                  "-e", f"{REPO}[test]")
    output = result.stdout + result.stderr
    if result.returncode != 0 and ("Could not fetch URL" in output or "NewConnectionError" in output):
        pytest.skip(f"the package index is not reachable: {output[-500:]}")
    assert result.returncode == 0, output[-3000:]
    assert "ResolutionImpossible" not in output
    assert "This is taking longer than usual" not in output, "pip backtracked"
    assert "Would install" in output and "boto3-" in output


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the pip this Python bundles, made once: each test gets a copy."""
    made = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(made, with_pip=True)
    return made


@pytest.mark.parametrize("which_pip", ["bundled", "current"])
def test_the_test_extra_resolves_with_old_and_current_pip(tmp_path: Path, which_pip: str, fresh_venv: Path) -> None:
    shutil.copytree(fresh_venv, tmp_path / "venv", symlinks=True)  # the pip this Python bundles
    python = tmp_path / "venv" / "bin" / "python"
    if which_pip == "current":
        upgraded = _pip(python, "install", "-q", "--upgrade", "pip")
        assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    else:
        version = _pip(python, "--version").stdout
        assert version.startswith("pip "), version
    _resolves(python)


def test_the_pins_are_what_the_suite_runs_on() -> None:
    """The venv running this suite has exactly the pinned S3 client stack."""
    from importlib import metadata

    namespace: dict[str, object] = {}
    source = (REPO / "setup.py").read_text()
    exec(source.split("\nsetup(", 1)[0].replace("from setuptools import setup", ""), namespace)
    for pin in namespace["S3_CLIENT_STACK"]:  # type: ignore[attr-defined]
        name, _, version = str(pin).partition("==")
        assert metadata.version(name) == version, (pin, sys.executable)
