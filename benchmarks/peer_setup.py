"""Set-up of ``benchmarks peers``: the peers installed from Debian packages when they are
missing, their versions, and the kernel page cache dropped before a cold mount.

Invariants:
- Packages are installed only as root, only those missing, with ``apt-get install -y``
  (what apt installs is printed); a package that cannot be installed is reported, and
  its peer's cells carry that error: nothing else changes.
- ``drop_page_cache`` never fails the run: it returns why it could not drop the cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TextIO

PEER_PACKAGES = {"s3fs": "s3fs", "rclone": "rclone"}  # program -> Debian package
APT_TIMEOUT_S = 900.0  # a fresh apt-get update and two small packages, on a slow mirror
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def install_peers(programs: set[str], log: TextIO) -> dict[str, str]:
    """Install the Debian packages of ``programs`` that are missing (``apt-get install
    -y``, as root; once more after ``apt-get update`` if that fails). Returns
    {program: why it is unavailable} for those still missing."""
    missing = sorted(p for p in programs if shutil.which(p) is None)
    if not missing:
        return {}
    packages = [PEER_PACKAGES[p] for p in missing]
    if os.geteuid() != 0:
        return {p: f"{p} is not installed and installing it needs root (apt-get install {PEER_PACKAGES[p]})"
                for p in missing}
    print(f"set-up: apt-get install -y {' '.join(packages)} ...", file=log, flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
    in_new_list = False  # apt lists the new packages on indented lines after this header
    for line in done.stdout.splitlines():
        in_new_list = line.startswith("The following NEW packages") or (in_new_list and line.startswith(" "))
        if in_new_list or line.startswith("Setting up "):
            print(f"  apt: {line.strip()}", file=log, flush=True)
    failed = done.stderr.strip()[-500:] or done.stdout.strip()[-500:]
    return {p: f"apt-get install {PEER_PACKAGES[p]} failed: {failed}" for p in missing if shutil.which(p) is None}


def peer_versions() -> dict[str, str]:
    """The first line of each installed peer's version output."""
    versions = {}
    for program, args in (("s3fs", ["--version"]), ("rclone", ["version"])):
        if shutil.which(program):
            done = subprocess.run([program, *args], capture_output=True, text=True, timeout=30)
            first = (done.stdout or done.stderr).strip().splitlines()
            versions[program] = first[0] if first else "unknown"
    return versions


def drop_page_cache() -> str | None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``: None if done, else why not."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as e:
        return f"cannot write {DROP_CACHES}: {e.strerror}"
    return None
