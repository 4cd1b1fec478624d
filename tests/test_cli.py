"""The tierfs command: every subcommand, exit codes, configuration precedence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def tierfs(data_dir: Path, *args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "--data-dir", str(data_dir), *args],
        input=stdin, capture_output=True, env={**os.environ, **(env or {})},
    )


def test_every_subcommand(tmp_path: Path) -> None:
    d = tmp_path / "data"
    assert tierfs(d, "mkdir", "logs").returncode == 0
    assert tierfs(d, "create", "logs/app.log").stdout == b"logs/app.log\n"
    assert tierfs(d, "append", "logs/app.log", "hello ").stdout == b"0\n"
    assert tierfs(d, "append", "logs/app.log", "-", stdin=b"world\n").stdout == b"6\n"
    f = tmp_path / "f.bin"
    f.write_bytes(b"\x00\x01")
    assert tierfs(d, "append", "logs/app.log", "--file", str(f)).stdout == b"12\n"
    assert tierfs(d, "cat", "logs/app.log").stdout == b"hello world\n\x00\x01"
    assert tierfs(d, "cat", "logs/app.log", "--offset", "6", "--length", "5").stdout == b"world"
    stat = json.loads(tierfs(d, "stat", "logs/app.log", "--json").stdout)
    assert stat["length"] == 14 and stat["durability"] == "pd"
    assert tierfs(d, "ls", "logs").stdout == b"app.log\n"
    assert b"logs/" in tierfs(d, "ls").stdout
    assert b"14" in tierfs(d, "ls", "-l", "logs").stdout
    assert tierfs(d, "sync", "logs/app.log").stdout == b"14\n"
    assert tierfs(d, "flush").returncode == 0
    assert tierfs(d, "seal", "logs/app.log").returncode == 0
    sealed = tierfs(d, "append", "logs/app.log", "x")
    assert sealed.returncode == 1 and b"sealed" in sealed.stderr
    assert tierfs(d, "unseal", "logs/app.log").returncode == 0
    assert tierfs(d, "mv", "logs/app.log", "logs/old.log").returncode == 0
    assert tierfs(d, "cat", "logs/old.log").stdout.startswith(b"hello")
    ok = tierfs(d, "fsck")
    assert ok.returncode == 0 and b"OK" in ok.stdout
    assert tierfs(d, "rm", "logs/old.log").returncode == 0
    assert tierfs(d, "rmdir", "logs").returncode == 0
    assert tierfs(d, "ls").stdout == b""
    assert tierfs(d, "create", "-p", "a/b/c", "--durability", "vd").returncode == 0
    assert json.loads(tierfs(d, "stat", "a/b/c", "--json").stdout)["durability"] == "vd"


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["cat", "missing"], 1, b"no such segment"),
        (["cat", "../etc/passwd"], 1, b"invalid name"),
        (["append", "x", "y", "--expected-offset", "5"], 1, b"no such segment"),
        (["frobnicate"], 2, b"invalid choice"),
        (["mkdir"], 2, b"required"),
    ],
)
def test_errors_are_messages_with_exit_codes(tmp_path: Path, args: list[str], code: int, message: bytes) -> None:
    result = tierfs(tmp_path / "d", *args)
    assert result.returncode == code
    assert message in result.stderr
    assert b"Traceback" not in result.stderr


def test_conditional_append_reports_both_offsets(tmp_path: Path) -> None:
    d = tmp_path / "d"
    tierfs(d, "create", "s")
    tierfs(d, "append", "s", "abc")
    result = tierfs(d, "append", "s", "x", "--expected-offset", "1")
    assert result.returncode == 1
    assert b"expected offset 1" in result.stderr and b"length is 3" in result.stderr


def test_configuration_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "tierfs.toml"
    toml.write_text('durability = "vd"\n')
    d = tmp_path / "d"
    tierfs(d, "--config", str(toml), "create", "from-file")
    tierfs(d, "create", "from-env", env={"TIERFS_CONFIG": str(toml), "TIERFS_DURABILITY": "pd"})
    tierfs(d, "--config", str(toml), "--durability", "pd", "mkdir", "x")
    assert json.loads(tierfs(d, "stat", "from-file", "--json").stdout)["durability"] == "vd"
    assert json.loads(tierfs(d, "stat", "from-env", "--json").stdout)["durability"] == "pd"
    bad = tmp_path / "bad.toml"
    bad.write_text("flush_byts = 3\n")
    result = tierfs(d, "--config", str(bad), "ls")
    assert result.returncode == 1 and b"unknown setting 'flush_byts'" in result.stderr


def test_data_dir_from_environment(tmp_path: Path) -> None:
    d = tmp_path / "env-dir"
    result = subprocess.run(
        [sys.executable, "-m", "tierfs.cli", "mkdir", "x"],
        capture_output=True, env={**os.environ, "TIERFS_DATA_DIR": str(d)},
    )
    assert result.returncode == 0, result.stderr
    assert (d / "metadata.sqlite").exists()


def test_mv_onto_an_existing_name_replaces_it_unless_it_is_sealed(tmp_path: Path) -> None:
    d = tmp_path / "data"
    for name, text in [("new", "new contents"), ("old", "old contents"), ("kept", "kept")]:
        assert tierfs(d, "create", name).returncode == 0
        assert tierfs(d, "append", name, text).returncode == 0
    assert tierfs(d, "mv", "new", "old").returncode == 0  # POSIX rename: atomic replace
    assert tierfs(d, "cat", "old").stdout == b"new contents"
    assert tierfs(d, "ls").stdout.split() == [b"kept", b"old"]
    assert tierfs(d, "seal", "kept").returncode == 0
    refused = tierfs(d, "mv", "old", "kept")
    assert refused.returncode == 1 and b"sealed" in refused.stderr
    assert tierfs(d, "cat", "kept").stdout == b"kept" and tierfs(d, "cat", "old").stdout == b"new contents"
