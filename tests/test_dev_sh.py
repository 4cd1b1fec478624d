"""``./dev.sh`` installs every program the suite, the README, docs/ and the benchmarks run.

A fresh Debian or Ubuntu machine has only its base system (the packages marked
Essential or of priority ``required``); everything else a test, a documented command or a
benchmark starts must be one of dev.sh's ``need COMMAND PACKAGE`` lines. The programs are
found where they are named: the first word of every command in the documents' shell
blocks, and the program of every ``subprocess``/``trio.run_process`` call, ``shutil.which``
and ``_require`` with a literal name in the Python of tests/, benchmarks/, examples/ and
tierfs/, and every command of the shell scripts in examples/ and benchmarks/.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from readme_runner import blocks

REPO = Path(__file__).resolve().parent.parent
PYTHON_TREES = ("tests", "benchmarks", "examples", "tierfs", "fuse", "fsspec_impl")
DOCUMENTS = ("README.md", "docs/mount.md", "docs/fsspec-and-spark.md", "docs/operations.md", "docs/several-hosts.md",
             "docs/API.md", "docs/RELIABILITY.md", "docs/PERFORMANCE.md")
PROGRAM_CALLS = {"run", "Popen", "check_output", "check_call", "call", "run_process", "which", "_require",
                 "execvp", "execv", "execlp"}
SHELL_WORDS = {"if", "then", "else", "elif", "fi", "for", "in", "do", "done", "while", "until", "case", "esac",
               "!", "{", "}", "(", ")", "function", "time"}
BUILTINS = {"cd", "echo", "export", "source", ".", "set", "unset", "exit", "trap", "wait", "kill", "read",
            "printf", "test", "[", "[[", "true", "false", "exec", "alias", "return", "shift", "local", "type",
            "hash", "command", "jobs", "fg", "bg", "ulimit", "umask", "pwd", "let", "eval", "declare", "sleep_"}
PREFIX_COMMANDS = {"timeout", "sudo", "env", "nohup", "exec", "command", "time", "setsid", "nice"}
# Run only with the project's own environment active (.venv/bin) or built by it.
PROJECT_PROGRAMS = {"tierfs", "python", "python3", "pip", "pytest", "ruff", "mypy", "spark-submit", "pyspark",
                    "./dev.sh", "dev.sh"}


def dev_sh_programs() -> set[str]:
    """The commands dev.sh installs when missing (its ``need`` lines, and the special cases)."""
    text = (REPO / "dev.sh").read_text()
    needed = set(re.findall(r"^\s*need (\S+) \S+", text, re.M))
    for loop in re.findall(r"for tool in ([^;]+); do need", text):
        needed.update(loop.split())
    needed.update({"java", "initdb", "postgres", "pg_ctl", "python3"})  # checked by version or path in dev.sh
    return needed


def _shell_commands(code: str) -> set[str]:
    """The first word of every simple command in ``code`` (and in its ``sh -c '...'`` strings)."""
    found: set[str] = set()
    code = re.sub(r"\$\{[^}]*\}", "x", code)  # ${name%.*}: an expansion, no command
    code = re.sub(r"\$?\(\([^()]*\)\)", " 0 ", code)  # $((arithmetic)) and ((tests))
    code = re.sub(r"\b(\w+)=\([^)]*\)", r"\1=x", code)  # name=(an array)
    code = re.sub(r"\$\(", " ; ", code.replace("`", " ; ").replace("\\\n", " "))
    for line in code.splitlines():
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            continue
        at_start, previous, command = True, "", ""
        for word in words:
            if set(word) <= set(";&|()"):
                at_start = True
                continue
            if previous == "for":  # the loop's variable
                previous = word
                continue
            if command in {"sh", "bash"} and previous == "-c":
                found |= _shell_commands(word)
            if at_start:
                if word in SHELL_WORDS or "=" in word.split("/")[0] or word in PREFIX_COMMANDS or word.isdigit():
                    previous = word
                    continue
                if word.startswith(("-", "$", '"')) or word.startswith(">") or word.startswith("<"):
                    previous = word
                    continue
                found.add(word)
                at_start, command = False, word
            previous = word
    return found


def document_programs() -> dict[str, str]:
    programs: dict[str, str] = {}
    for name in DOCUMENTS:
        for block in blocks(REPO / name):
            if block.kind == "sh":
                for program in _shell_commands(block.code):
                    programs.setdefault(program, block.name)
    return programs


def script_programs() -> dict[str, str]:
    """The programs the shell scripts of examples/ and benchmarks/ run."""
    programs: dict[str, str] = {}
    for tree in ("examples", "benchmarks"):
        for path in sorted((REPO / tree).rglob("*.sh")):
            for program in _shell_commands(path.read_text()):
                programs.setdefault(program, str(path.relative_to(REPO)))
    return programs


def python_programs() -> dict[str, str]:
    programs: dict[str, str] = {}
    for tree in PYTHON_TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                function = node.func
                name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
                if name not in PROGRAM_CALLS:
                    continue
                if isinstance(function, ast.Attribute) and getattr(function.value, "id", "") not in {
                        "subprocess", "shutil", "trio", "os"}:
                    continue
                first = node.args[0]
                if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
                    first = first.elts[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.strip():
                    program = first.value.split()[0]
                    programs.setdefault(program, f"{path.relative_to(REPO)}:{node.lineno}")
    return programs


def _in_base_system(program: str) -> str | None:
    """The Debian package of ``program`` if that package is Essential or priority
    ``required`` (on every minimal Debian/Ubuntu machine), else None."""
    # a user's PATH may lack the sbin directories (runuser, useradd) that root's has
    path = shutil.which(program) or shutil.which(program, path="/usr/local/sbin:/usr/sbin:/sbin")
    if path is None:
        return None
    # a merged /usr: dpkg may know the file as /bin/X while PATH finds /usr/bin/X (sbin alike)
    candidates = {path, str(Path(path).resolve())}
    candidates |= {c.removeprefix("/usr") for c in candidates if c.startswith(("/usr/bin/", "/usr/sbin/"))}
    for candidate in sorted(candidates):
        owner = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if owner.returncode == 0:
            package = owner.stdout.split(":", 1)[0].strip()
            fields = subprocess.run(["dpkg-query", "-W", "-f=${Essential} ${Priority}", package],
                                    capture_output=True, text=True).stdout
            if fields.startswith("yes") or fields.endswith("required"):
                return package
    return None


def test_the_scanner_sees_commands_where_they_are_written() -> None:
    assert _shell_commands("timeout 60 sh -c 'until curl -s x; do sleep 0.2; done' # up") == {"sh", "curl",
                                                                                               "sleep"}
    assert _shell_commands("A=1 tierfs cat x | head -c 3 > out && echo $(date)") == {"tierfs", "head", "echo",
                                                                                       "date"}
    assert "curl" in document_programs()
    found = python_programs()
    assert {"fusermount3", "rsync", "git", "npm", "node"} <= set(found)
    assert {"tierfs", "sync", "seq"} <= set(script_programs())


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="tells the base system's programs by their Debian package")
def test_dev_sh_installs_every_program_that_is_run() -> None:
    installed = dev_sh_programs()
    run = {**document_programs(), **script_programs(), **python_programs()}
    missing = []
    for program, where in sorted(run.items()):
        if program in installed or program in PROJECT_PROGRAMS or program in BUILTINS:
            continue
        if program.startswith(("/", "./", "~", ".venv/")):
            continue  # a path: a program of the project or of the user's own
        if _in_base_system(program) is None:
            missing.append(f"{program} (run at {where})")
    assert not missing, ("dev.sh does not install these programs, and no minimal Debian/Ubuntu has them: "
                         + ", ".join(missing) + ". Add a `need COMMAND PACKAGE` line to dev.sh.")
