"""The package's layering, checked from the source: every import of every tierfs module
(module level and inside functions alike) must point to a layer the importing layer may
use, the module import graph has no cycle, and no module grows past the size a newcomer
can read in one sitting.

The layers (also in tierfs/__init__.py and docs/ARCHITECTURE.md):

    contracts <- blocks <- engine <- offload <- store <- server
    contracts, blocks <- remote <- spark, fsspec_impl
    store, server <- fuse;   everything <- cli, testing
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A module past this does more than one job (split it by job, never to fit a count: a
# grab-bag of leftovers is worse than a long module with one job).
MAX_MODULE_LINES = 600

# package folder -> the import name it is installed under (setup.py package_dir)
SOURCE_ROOTS = {"tierfs": "tierfs", "fuse": "tierfs.fuse", "fsspec_impl": "tierfs.fsspec_impl"}

BASE = {"contracts", "blocks"}
ALLOWED: dict[str, set[str]] = {
    "contracts": {"contracts"},
    "blocks": BASE,
    "engine": BASE | {"engine"},
    "offload": BASE | {"engine", "offload"},
    "store": BASE | {"engine", "offload", "store"},
    "cluster": BASE | {"engine", "store", "remote", "cluster"},
    "server": BASE | {"store", "cluster", "server"},
    "remote": BASE | {"remote"},
    "spark": BASE | {"remote", "spark"},
    "fsspec_impl": BASE | {"remote", "fsspec_impl"},
    "fuse": BASE | {"store", "cluster", "server", "fuse"},
    # the public API: contracts at import time, the façade lazily (tierfs/__init__.py)
    "root": {"contracts", "store"},
    "cli": BASE | {"remote", "store", "cluster", "server", "fuse", "cli"},
    "testing": set(),  # filled below: test support may use every layer
    "bench": set(),
}
LAYERS = [name for name in ALLOWED if name != "root"]
ALLOWED["testing"] = set(LAYERS)
ALLOWED["bench"] = set(LAYERS)


def module_files() -> dict[str, Path]:
    found = {}
    for folder, package in SOURCE_ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts == ["tierfs"]:
        return "root"
    layer = parts[1]
    if layer not in ALLOWED:
        raise AssertionError(f"{module} is in no layer: add its folder to ALLOWED in {__file__}")
    return layer


def imports_of(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported tierfs module, line) of every import in ``path``, relative ones resolved;
    ``from package import submodule`` counts as an import of the submodule."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((submodule if submodule in known else target, node.lineno))
    return [(name, line) for name, line in found if name == "tierfs" or name.startswith("tierfs.")]


def import_graph() -> dict[str, list[tuple[str, int]]]:
    files = module_files()
    known = set(files)
    return {module: imports_of(module, path, known) for module, path in files.items()}


def violations(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    wrong = []
    for module, imported in graph.items():
        source = layer_of(module)
        for target, line in imported:
            if target == "tierfs":
                if source not in ("root", "testing", "bench"):
                    wrong.append(f"{module}:{line} imports the package root (import the module itself)")
            elif layer_of(target) not in ALLOWED[source]:
                wrong.append(f"{module}:{line} ({source}) imports {target} ({layer_of(target)})")
    return wrong


def cycles_in(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    edges = {module: sorted({target for target, _ in imported}) for module, imported in graph.items()}
    state: dict[str, str] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in edges.get(module, []):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return cycles


def test_every_import_points_down_or_sideways() -> None:
    wrong = violations(import_graph())
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    cycles = cycles_in(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_is_too_long_to_read() -> None:
    long = {
        str(path.relative_to(REPO)): lines
        for path in module_files().values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by operation): {long}"


def test_the_checks_notice_upward_imports_and_cycles(tmp_path: Path) -> None:
    """Guards the checker itself: a relative upward import is resolved and refused, and
    a two-module cycle is found."""
    source = tmp_path / "journal.py"
    source.write_text("from ..server import http_api\nfrom . import tail\n")
    known = {"tierfs.server.http_api", "tierfs.engine.tail"}
    imported = imports_of("tierfs.engine.journal", source, known)
    assert imported == [("tierfs.server.http_api", 1), ("tierfs.engine.tail", 2)]
    assert violations({"tierfs.engine.journal": imported}) == [
        "tierfs.engine.journal:1 (engine) imports tierfs.server.http_api (server)"
    ]
    graph = {"tierfs.engine.a": [("tierfs.engine.b", 1)], "tierfs.engine.b": [("tierfs.engine.a", 3)]}
    assert cycles_in(graph) == [["tierfs.engine.a", "tierfs.engine.b", "tierfs.engine.a"]]
