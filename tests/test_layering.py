"""The package's layering, checked from the source: every import of every tierfs and
benchmarks module (module level and inside functions alike, and ``importlib`` imports)
must point to a layer the importing layer may use, the engine's parts import only parts
below them, the module import graph has no cycle, no module grows past the size a
newcomer can read in one sitting, and no folder holds more modules than one can keep
apart.

The layers (also in tierfs/__init__.py and docs/ARCHITECTURE.md):

    contracts <- blocks <- engine <- offload <- store <- server
    contracts, blocks <- remote <- spark, fsspec_impl
    store, server <- fuse;   everything <- cli, testing, benchmarks

Inside the engine (``ENGINE_ORDER``, bottom to top; the peers on one line never import
each other): its shared root modules <- journal <- metadata <- tier2 <- ownership <-
segments <- ports <- read, flush, upkeep, recovery, backup <- appender.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A module past this does more than one job (split it by job, never to fit a count: a
# grab-bag of leftovers is worse than a long module with one job).
MAX_MODULE_LINES = 600
# A folder past this wants sub-packages by job (``__init__`` not counted).
MAX_FOLDER_MODULES = 15

# package folder -> the import name it is installed under (setup.py package_dir)
SOURCE_ROOTS = {"tierfs": "tierfs", "fuse": "tierfs.fuse", "fsspec_impl": "tierfs.fsspec_impl",
                "benchmarks": "benchmarks"}
IMPORTED_NAMES = ("tierfs", "benchmarks")

# The engine's parts, bottom to top. A part is a sub-package of tierfs/engine/, or one of
# the root modules named here; the engine's other root modules (and the package itself)
# are the shared part at the bottom. A module may import its own part and the parts of
# lower lines, never a peer on its own line.
ENGINE_ORDER: list[set[str]] = [
    {"shared"},
    {"journal"},
    {"metadata"},
    {"tier2"},
    {"ownership"},
    {"segments"},
    {"ports"},
    {"read", "flush", "upkeep", "recovery", "backup"},
    {"appender"},
]
ENGINE_ROOT_PARTS = {"ports", "appender"}

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
    if parts[0] == "benchmarks":
        return "bench"
    if parts == ["tierfs"]:
        return "root"
    layer = parts[1]
    if layer not in ALLOWED:
        raise AssertionError(f"{module} is in no layer: add its folder to ALLOWED in {__file__}")
    return layer


def engine_part(module: str) -> str | None:
    """The engine part ``module`` belongs to (see ``ENGINE_ORDER``), None outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["tierfs", "engine"]:
        return None
    inside = parts[2:]
    if len(inside) >= 2 or (len(inside) == 1 and (REPO / "tierfs" / "engine" / inside[0]).is_dir()):
        return inside[0]
    if inside and inside[0] in ENGINE_ROOT_PARTS:
        return inside[0]
    return "shared"


def engine_level(part: str) -> int:
    for level, parts in enumerate(ENGINE_ORDER):
        if part in parts:
            return level
    raise AssertionError(f"the engine part {part!r} has no place in ENGINE_ORDER ({__file__})")


def _calls_import_module(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in ("import_module", "__import__"):
                return True
    return False


def imports_of(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported tierfs or benchmarks module, line) of every import in ``path``, relative
    ones resolved; ``from package import submodule`` counts as an import of the
    submodule. A module that imports by name (``importlib.import_module``) imports every
    module whose full name stands in it as a string: the names it can be handed."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    if _calls_import_module(tree):
        found += [
            (node.value, node.lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known
        ]
    for node in ast.walk(tree):
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
    return [(name, line) for name, line in found
            if any(name == top or name.startswith(top + ".") for top in IMPORTED_NAMES)]


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
            elif target != "benchmarks" and layer_of(target) not in ALLOWED[source]:
                wrong.append(f"{module}:{line} ({source}) imports {target} ({layer_of(target)})")
            elif (part := engine_part(module)) and (target_part := engine_part(target)) and part != target_part:
                if engine_level(target_part) >= engine_level(part):
                    wrong.append(f"{module}:{line} (engine/{part}) imports {target} (engine/{target_part}): "
                                 "not below it in ENGINE_ORDER")
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


def test_no_folder_holds_too_many_modules() -> None:
    crowded = {}
    for folder in SOURCE_ROOTS:
        for directory in [REPO / folder, *(p for p in (REPO / folder).rglob("*") if p.is_dir())]:
            modules = [p for p in directory.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_FOLDER_MODULES:
                crowded[str(directory.relative_to(REPO))] = len(modules)
    assert not crowded, f"folders over {MAX_FOLDER_MODULES} modules (make sub-packages by job): {crowded}"


def test_every_engine_package_states_its_invariants_and_imports() -> None:
    for init in sorted((REPO / "tierfs" / "engine").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Invariants:" in doc and "May import:" in doc, (
            f"{init.relative_to(REPO)}: its docstring states the package's invariants and what it may import")


def test_the_checks_notice_upward_imports_and_cycles(tmp_path: Path) -> None:
    """Guards the checker itself: a relative upward import is resolved and refused, an
    engine part importing a part above it or a peer is refused, an import by name is
    seen, and a two-module cycle is found."""
    source = tmp_path / "log.py"
    source.write_text("from ...server import http_api\nfrom . import frames\nfrom ..segments import tail\n")
    known = {"tierfs.server.http_api", "tierfs.engine.journal.frames", "tierfs.engine.segments.tail"}
    imported = imports_of("tierfs.engine.journal.log", source, known)
    assert imported == [("tierfs.server.http_api", 1), ("tierfs.engine.journal.frames", 2),
                        ("tierfs.engine.segments.tail", 3)]
    assert violations({"tierfs.engine.journal.log": imported}) == [
        "tierfs.engine.journal.log:1 (engine) imports tierfs.server.http_api (server)",
        "tierfs.engine.journal.log:3 (engine/journal) imports tierfs.engine.segments.tail (engine/segments): "
        "not below it in ENGINE_ORDER",
    ]
    peers = {"tierfs.engine.read.reader": [("tierfs.engine.flush.plan", 1), ("tierfs.engine.ports", 2)]}
    assert violations(peers) == [
        "tierfs.engine.read.reader:1 (engine/read) imports tierfs.engine.flush.plan (engine/flush): "
        "not below it in ENGINE_ORDER"
    ]
    by_name = tmp_path / "main.py"
    by_name.write_text('import importlib\nRUNS = {"a": "benchmarks.append"}\nimportlib.import_module(RUNS["a"])\n')
    assert imports_of("benchmarks.main", by_name, {"benchmarks.append"}) == [("benchmarks.append", 2)]
    graph = {"tierfs.engine.a": [("tierfs.engine.b", 1)], "tierfs.engine.b": [("tierfs.engine.a", 3)]}
    assert cycles_in(graph) == [["tierfs.engine.a", "tierfs.engine.b", "tierfs.engine.a"]]
