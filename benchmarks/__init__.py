"""tierfs benchmarks: ``python -m benchmarks <name>`` from the repository root.

A plain package of the source tree, never installed; tierfs itself must be installed
(``pip install -e .``). Each command is one scenario measuring tierfs next to a ceiling
or a peer in the same run; ``harness/`` is what they share.

Invariant: the repository root is never left on ``sys.path``: it holds a folder named
``fuse`` that would take over ``import fuse`` (fusepy, used by ``fsspec.fuse``), so it is
removed below, before anything else is imported. Child processes get the root through
``child_command`` / ``child_environment``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def _is_repository_root(entry: str) -> bool:
    try:
        return Path(entry or os.curdir).resolve() == REPOSITORY_ROOT
    except OSError:
        return False


sys.path[:] = [entry for entry in sys.path if not _is_repository_root(entry)]


def child_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` (``benchmarks.x``) in a new interpreter."""
    return [sys.executable, "-m", module, *args]


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the repository root first on
    PYTHONPATH, so ``python -m benchmarks.x`` works from any directory."""
    result = dict(os.environ if env is None else env)
    result["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPOSITORY_ROOT), result.get("PYTHONPATH", "")) if p)
    return result
