"""``tests/pyspark_bytecode.py``: a zip it rewrote imports each module from its compiled
code, behaves as before, and falls back to the source where the code does not match."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from pyspark_bytecode import add_bytecode

MODULE = "VALUE = sum(range(10))\n\n\ndef where():\n    return where.__code__.co_filename\n"


def _imported(zip_path: Path) -> tuple[str, str]:
    """(the module's file, its VALUE) as imported from ``zip_path``; its code carries the
    name a traceback shows, which compiled code must keep."""
    done = subprocess.run([sys.executable, "-c", "import m; print(m.__file__); print(m.VALUE); print(m.where())"],
                          env={"PYTHONPATH": str(zip_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    where, value, code_name = done.stdout.split()
    assert code_name == f"{zip_path}/m.py"
    return where, value


def test_a_rewritten_zip_imports_compiled_code_and_keeps_its_sources(tmp_path: Path) -> None:
    zip_path = tmp_path / "lib.zip"
    with zipfile.ZipFile(zip_path, "w") as out:
        out.writestr("m.py", MODULE)
    assert _imported(zip_path) == (f"{zip_path}/m.py", "45")
    assert add_bytecode(zip_path) is True
    assert add_bytecode(zip_path) is False  # once
    with zipfile.ZipFile(zip_path) as rewritten:
        assert sorted(rewritten.namelist()) == ["m.py", "m.pyc"]
        assert rewritten.read("m.py").decode() == MODULE
    assert _imported(zip_path) == (f"{zip_path}/m.pyc", "45")


def test_code_that_does_not_match_its_source_is_not_used(tmp_path: Path) -> None:
    zip_path = tmp_path / "lib.zip"
    with zipfile.ZipFile(zip_path, "w") as out:
        out.writestr("m.py", MODULE)
    add_bytecode(zip_path)
    with zipfile.ZipFile(zip_path) as compiled:
        code = compiled.read("m.pyc")
        info = compiled.getinfo("m.py")
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(changed, "w") as out:  # a new source of another size, the old code
        out.writestr(info, "VALUE = 7 * 6\n\n\ndef where():\n    return where.__code__.co_filename\n")
        out.writestr(zipfile.ZipInfo("m.pyc", info.date_time), code)
    assert _imported(changed) == (f"{changed}/m.py", "42")

