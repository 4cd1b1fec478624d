"""Bytecode inside PySpark's ``python/lib/*.zip``, for the Python processes Spark starts.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path of
every Python process it starts: its workers' daemons and workers, and the runners that
plan and read a Python data source (tierfs's format is one). The zips PySpark ships
hold sources only, and Python does not cache what it compiles from a zip, so each of
those processes compiled PySpark again: 0.65-0.72 CPU-s to import ``pyspark.worker``
against 0.13 from the installed package, measured on the 2-core machine, where one run
of the suite starts ~160 of them (~120 CPU-s of its ~900). ``./dev.sh`` (both the demo
and the tests) adds, once per venv, each module's compiled code beside its source in the
zip: 0.2 CPU-s to import it.

Safe by construction: the sources stay, each compiled entry carries its source's time
and size and the interpreter's magic number, and Python's zip importer falls back to
the source whenever either differs (another Python, a changed zip). The new zip is
written under a temporary name and renamed when whole; a zip that already holds
bytecode is left as it is.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import time
import zipfile
from pathlib import Path


def spark_zips() -> list[Path]:
    """PySpark's ``python/lib/*.zip`` (none without PySpark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return []
    return sorted((Path(spec.origin).parent / "python" / "lib").glob("*.zip"))


def _pyc(source: bytes, info: zipfile.ZipInfo, path: Path) -> bytes:
    """The zip importer's ``.pyc`` for ``source``: magic, flags 0 (checked against the
    source's time and size, both as the zip records them), then the code, compiled under
    the name the zip importer gives it (tracebacks read the same)."""
    code = compile(source, f"{path}{os.sep}{info.filename}", "exec", dont_inherit=True)
    mtime_s = int(time.mktime((*info.date_time, 0, 0, -1)))  # as zipimport reads a DOS time
    return (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + (mtime_s & 0xFFFFFFFF).to_bytes(4, "little")
            + (len(source) & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))


def add_bytecode(path: Path) -> bool:
    """Rewrite ``path`` with a ``.pyc`` beside each ``.py``; False if it had some."""
    with zipfile.ZipFile(path) as zip_in:
        if any(name.endswith(".pyc") for name in zip_in.namelist()):
            return False
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as zip_out:
                for info in zip_in.infolist():
                    data = zip_in.read(info)
                    zip_out.writestr(info, data)
                    if info.filename.endswith(".py"):
                        try:
                            compiled = _pyc(data, info, path)
                        except (SyntaxError, ValueError):  # left to the source, as before
                            continue
                        zip_out.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), compiled)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return True


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore", SyntaxWarning)  # PySpark's own tests' sources
    for zip_path in spark_zips():
        try:
            if add_bytecode(zip_path):
                print(f"dev.sh: compiled the Python inside {zip_path.name} for Spark's Python processes",
                      file=sys.stderr)
        except (OSError, zipfile.BadZipFile) as e:  # only slower without it
            print(f"dev.sh: {zip_path} left as it is ({e})", file=sys.stderr)
