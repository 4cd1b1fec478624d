#!/usr/bin/env bash
# One entry point for a fresh Debian/Ubuntu machine (see README.md):
#   ./dev.sh demo     install what is missing, then run the example pipeline
#                     (examples/pipeline.py) on embedded defaults
#   ./dev.sh test     install what is missing, then run ruff, mypy and the test suite
# It installs only what is missing: apt packages (as root, or through sudo), a .venv
# with tierfs and its test dependencies. Re-running it is cheap.
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-}"
case "$mode" in
  demo|test) ;;
  *) echo "usage: ./dev.sh demo|test" >&2; exit 2 ;;
esac

apt_missing=()
# need COMMAND PACKAGE [test]: install Debian's PACKAGE when COMMAND is not on PATH ("test":
# only for ./dev.sh test). Every program the suite, the README and the benchmarks run is
# either listed here or part of every Debian/Ubuntu base system (tests/test_dev_sh.py checks).
need() {
  if [ "${3:-}" = test ] && [ "$mode" != test ]; then return; fi
  command -v "$1" >/dev/null || apt_missing+=("$2")
}
need python3 python3
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_missing+=(python3-venv)
need gcc build-essential
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null \
  || apt_missing+=(python3-dev)
# FUSE: fusermount3 for mounting (and auto_unmount), libfuse3 headers + pkg-config to
# build pyfuse3, getfattr/setfattr for the tests and users
need fusermount3 fuse3
need pkg-config pkg-config
{ command -v pkg-config >/dev/null && pkg-config --exists fuse3; } || apt_missing+=(libfuse3-dev)
need getfattr attr
need setfattr attr
# the README waits for its daemons with curl; docs/API.md is curl examples
need curl curl
# Spark (PySpark >= 4 needs Java >= 17) for the data source and its tests
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
{ command -v java >/dev/null && [ "$(java_major)" -ge 17 ] 2>/dev/null; } || apt_missing+=(openjdk-17-jre-headless)
# the real tools the mount's tests drive (tests/test_fuse_tools.py, test_fuse_caches.py)
for tool in rsync git vim strace; do need "$tool" "$tool" test; done
# the completion scripts are tested in the shells they are for (tests/test_cli.py)
need zsh zsh test
# the benchmarks' S3 server (s3rver, from npm) and peers, which the suite runs small
need node nodejs test
need npm npm test
need s3fs s3fs test
need rclone rclone test
need valgrind valgrind test
# the service units are checked with systemd-analyze (tests/test_service_units.py); docs/operations.md installs them with systemctl
need systemd-analyze systemd test
need systemctl systemd test
# PostgreSQL (Debian's server) for the metadata tests on a real PostgreSQL; demo mode runs without it
if [ "$mode" = test ] && ! command -v initdb >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  apt_missing+=(postgresql)
fi
if ((${#apt_missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  mapfile -t apt_missing < <(printf '%s\n' "${apt_missing[@]}" | sort -u)
  echo "dev.sh: installing ${apt_missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${apt_missing[@]}"
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "dev.sh: tierfs needs Python >= 3.11, found $(python3 --version)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "dev.sh: creating the virtual environment .venv" >&2
  python3 -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ setup.py -nt .venv/.installed ]; then
  echo "dev.sh: installing tierfs and its test dependencies (PySpark, pyarrow, pandas, moto, ...) into" \
       ".venv with pip: about 3 minutes the first time, seconds after that" >&2
  .venv/bin/python -m pip install --progress-bar on --upgrade pip
  # setuptools warns that fuse/ and fsspec_impl/ sit beside the package: they are
  # mapped into it on purpose (setup.py), so the warning is noise to a new user
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --progress-bar on -e ".[test]"
  touch .venv/.installed
  echo "dev.sh: .venv is ready" >&2
fi
# PySpark >= 4.0 registers the DefaultSource of every top-level module named pyspark_*
# that pkgutil can list; an editable install's package is imported through a finder that
# pkgutil does not list, so give it a listed module too (a regular install has a real
# pyspark_tierfs package): format("tierfs") then works in this venv without register().
site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -d "$site_packages/pyspark_tierfs" ] && [ ! -f "$site_packages/pyspark_tierfs.py" ]; then
  printf '%s\n' '"""Lists tierfs for PySpark in an editable install (written by dev.sh)."""' \
    'from tierfs.spark.source import TierDataSource as DefaultSource' '' '__all__ = ["DefaultSource"]' \
    > "$site_packages/pyspark_tierfs.py"
fi

export PYSPARK_PYTHON="$PWD/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
# The tree's bytecode, compiled once (seconds; later runs only what changed): the demo and
# the suite start hundreds of Python processes (daemons, commands, Spark's workers), and
# where PYTHONDONTWRITEBYTECODE is set (many container images) none of them writes what it
# compiled, so each would compile tierfs again (~0.15 CPU-s per daemon). pip compiled the venv.
.venv/bin/python -m compileall -q -j 0 -x node_modules tierfs fuse fsspec_impl examples benchmarks tests >/dev/null
.venv/bin/python tests/pyspark_bytecode.py  # the same for PySpark's zip, which Spark's Python processes import
case "$mode" in
  demo)
    exec .venv/bin/python examples/pipeline.py
    ;;
  test)
    .venv/bin/python tests/jvm_class_archive.py  # Spark's classes for the suite's JVMs, made once
    .venv/bin/ruff check tierfs fuse fsspec_impl tests examples benchmarks
    .venv/bin/mypy
    # Three workers (-n 3), each test file on one of them (--dist loadfile: a module's shared
    # daemon starts once; the files on the session's SparkSession go together, tests/conftest.py):
    # the tests spend more than half their time waiting on daemons, mounts, JVMs and fsync,
    # so on two cores three workers keep both busy: about 8 minutes.
    # --durations: the slowest tests are named in every run, so the suite stays well under 20 minutes.
    # One file alone: .venv/bin/pytest tests/test_x.py; the long runs: .venv/bin/pytest -m slow tests
    # PYTHONDONTWRITEBYTECODE emptied for the run: pytest then keeps its assert-rewritten
    # test modules in __pycache__ (git-ignored) as compileall did the rest, instead of
    # rewriting every test module in every worker on every run.
    PYTHONDONTWRITEBYTECODE= exec .venv/bin/pytest -q -m "not slow" -n 3 --dist loadfile --durations=25 tests
    ;;
esac
