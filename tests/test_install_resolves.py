"""`pip install -e '.[test]'` resolves quickly with the pip a fresh Python 3.11 venv
ships (23.x) and with a current pip (issue 17 item 8): the S3 client stack is pinned
as one tested set in setup.py, so neither pip backtracks or gives up.

This resolves against the package index (``--dry-run``: nothing is installed).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESOLVE_TIMEOUT_S = 240  # far above the ~10-30 s both take; a backtracking pip takes minutes


def _resolves(pip: list[str]) -> None:
    result = subprocess.run([*pip, "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check",
                  "-e", f"{REPO}[test]"], capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, cwd=REPO)
    output = result.stdout + result.stderr
    if result.returncode != 0 and ("Could not fetch URL" in output or "NewConnectionError" in output):
        pytest.skip(f"the package index is not reachable: {output[-500:]}")
    assert result.returncode == 0, output[-3000:]
    assert "ResolutionImpossible" not in output
    assert "This is taking longer than usual" not in output, "pip backtracked"
    assert "Would install" in output and "boto3-" in output


def _bundled_pip(tmp_path: Path) -> list[str]:
    """The pip a new venv of this Python gets: run from the wheel ensurepip installs it
    from, or (where that wheel is not where ensurepip keeps it) from a new venv."""
    import ensurepip

    try:
        package = ensurepip._get_packages()["pip"]  # type: ignore[attr-defined]
        wheel = Path(package.wheel_path or Path(ensurepip.__file__).parent / "_bundled" / package.wheel_name)
    except (AttributeError, KeyError, TypeError):
        wheel = Path("/nonexistent")
    if wheel.is_file():
        return [sys.executable, str(wheel / "pip")]
    venv.create(tmp_path / "venv", with_pip=True)
    return [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip"]


@pytest.mark.parametrize("which_pip", ["bundled", "current"])
def test_the_test_extra_resolves_with_old_and_current_pip(which_pip: str, tmp_path: Path) -> None:
    """``bundled``: the pip a fresh venv ships, run from its wheel; ``current``: the pip
    ``dev.sh`` upgrades the suite's venv to."""
    pip = _bundled_pip(tmp_path) if which_pip == "bundled" else [sys.executable, "-m", "pip"]
    version = subprocess.run([*pip, "--version"], capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
    assert version.stdout.startswith("pip "), version.stdout + version.stderr
    _resolves(pip)


def test_the_pins_are_what_the_suite_runs_on() -> None:
    """The venv running this suite has exactly the pinned S3 client stack."""
    from importlib import metadata

    namespace: dict[str, object] = {}
    source = (REPO / "setup.py").read_text()
    exec(source.split("\nsetup(", 1)[0].replace("from setuptools import setup", ""), namespace)
    for pin in namespace["S3_CLIENT_STACK"]:  # type: ignore[attr-defined]
        name, _, version = str(pin).partition("==")
        assert metadata.version(name) == version, (pin, sys.executable)
