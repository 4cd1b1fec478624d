"""The tierfs command: every subcommand, exit codes, configuration precedence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tierfs.testing.cli_runner import run_tierfs


def tierfs(data_dir: Path, *args: str, stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    """The command in this process (what it does); the tests of what only a process shows
    (the entry script, global options' placement, the environment's data dir) run one."""
    return run_tierfs("--data-dir", str(data_dir), *args, stdin=stdin, env=env)


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


def test_a_command_in_process_prints_and_returns_what_its_process_does(tmp_path: Path) -> None:
    """The premise of the in-process runner: the same exit code, stdout and stderr as
    ``python -m tierfs.cli``, for output, stdin, failures, usage errors, help and -v."""
    commands: list[tuple[list[str], bytes]] = [
        (["mkdir", "logs"], b""), (["create", "logs/a"], b""), (["append", "logs/a", "-"], b"one\ntwo\n"),
        (["cat", "logs/a"], b""), (["ls", "-l", "logs"], b""), (["tail", "-n", "1", "logs/a"], b""),
        (["cat", "missing"], b""), (["cat", "missing", "--json"], b""), (["cat", "logs/a", "--length", "-5"], b""),
        (["mkdir", "a/b"], b""), (["append", "--help"], b""), (["--config", str(tmp_path / "none.toml"), "ls"], b""),
        (["flush"], b""), (["-v", "sync", "logs/a"], b""),
    ]
    for args, stdin in commands:
        here = tierfs(tmp_path / "here", *args, stdin=stdin)
        process = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(tmp_path / "process"), *args],
                                 input=stdin, capture_output=True)
        shown = here.stdout.replace(b"/here", b"/process"), _untimed(here.stderr.replace(b"/here", b"/process"))
        assert (here.returncode, *shown) == (process.returncode, process.stdout, _untimed(process.stderr)), args


def _untimed(log: bytes) -> bytes:
    return re.sub(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", b"", log, flags=re.M)


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


# ---------------------------------------------------------------- one grammar (issue 20 item 3)
@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("4k", 4096), ("4K", 4096), ("4KiB", 4096), ("4kb", 4000), ("64MiB", 64 << 20),
    ("1GiB", 1 << 30), ("1.5GiB", 3 << 29), ("2 MB", 2_000_000), ("0", 0), ("1T", 1 << 40),
])
def test_sizes_take_units(text: str, expected: int) -> None:
    from tierfs.contracts.units import format_size, parse_size

    assert parse_size(text) == expected
    assert parse_size(format_size(expected)) == expected  # printed back in a form that parses


@pytest.mark.parametrize("text, expected", [
    ("30", 30.0), ("30s", 30.0), ("500ms", 0.5), ("5m", 300.0), ("4h", 14400.0), ("1h30m", 5400.0),
    ("30d", 2592000.0), ("1w", 604800.0), ("0.25", 0.25),
])
def test_durations_take_units(text: str, expected: float) -> None:
    from tierfs.contracts.units import format_duration, parse_duration

    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize("bad", ["lots", "-1", "4 kilos", "1.5", "k", "", "1e3"])
def test_what_is_not_a_size(bad: str) -> None:
    from tierfs.contracts.errors import InvalidArgumentError
    from tierfs.contracts.units import parse_size

    with pytest.raises(InvalidArgumentError, match="max_chunk_bytes"):
        parse_size(bad, "max_chunk_bytes")


def test_units_are_printed_back_as_typed() -> None:
    from tierfs.contracts.units import format_duration, format_size

    assert [format_size(v) for v in (1 << 30, 64 << 20, 4096, 1000, 0)] == ["1GiB", "64MiB", "4KiB", "1000", "0"]
    assert [format_duration(v) for v in (14400, 5400, 2592000, 0.5, 0, 90)] == ["4h", "1h30m", "30d", "500ms",
                                                                                "0s", "1m30s"]


def test_store_config_takes_str_paths_and_units(tmp_path: Path) -> None:
    from tierfs import StoreConfig
    from tierfs.contracts.config import load_config

    config = StoreConfig(data_dir=str(tmp_path / "d"), max_chunk_bytes="64MiB",  # type: ignore[arg-type]
                         flush_interval_s="500ms")  # type: ignore[arg-type]
    assert config.data_dir == tmp_path / "d" and isinstance(config.data_dir, Path)
    assert (config.max_chunk_bytes, config.flush_interval_s) == (64 << 20, 0.5)
    assert StoreConfig(data_dir="~/x").data_dir == Path.home() / "x"  # type: ignore[arg-type]
    toml = tmp_path / "c.toml"
    toml.write_text('block_cache_bytes = "1GiB"\norphan_grace_s = "4h"\n')
    loaded = load_config(environ={"TIERFS_FLUSH_BYTES": "4k"}, config_file=toml)
    assert (loaded.block_cache_bytes, loaded.orphan_grace_s, loaded.flush_bytes) == (1 << 30, 14400.0, 4096)


def test_policies_take_units_and_show_them(tmp_path: Path) -> None:
    d = tmp_path / "d"
    assert tierfs(d, "mkdir", "logs").returncode == 0
    done = tierfs(d, "policy", "set", "logs", "offload_hot_bytes=1GiB", "retention_s=4h", "offload_after_s=30m",
                  "rewrite_replaces=yes")
    assert done.returncode == 0, done.stderr
    shown = done.stdout.decode()
    assert "offload_hot_bytes  1GiB  (set here)" in shown and "retention_s        4h  (set here)" in shown
    assert "offload_after_s    30m  (set here)" in shown and "rewrite_replaces   1  (set here)" in shown
    as_json = json.loads(tierfs(d, "policy", "get", "logs", "--json").stdout)
    assert as_json["effective"]["offload_hot_bytes"]["value"] == 1 << 30  # --json: bytes and seconds
    assert as_json["effective"]["retention_s"]["value"] == 14400
    refused = tierfs(d, "policy", "set", "logs", "offload_after_s=5h")  # at or above retention_s=4h
    assert refused.returncode == 1 and b"offload_after_s=5h is at or above retention_s=4h" in refused.stderr


def test_flags_with_units(tmp_path: Path) -> None:
    d = tmp_path / "d"
    tierfs(d, "create", "s")
    tierfs(d, "append", "s", "-", stdin=b"x" * 5000)
    assert len(tierfs(d, "cat", "s", "--offset", "1k", "--length", "2k").stdout) == 2048
    assert len(tierfs(d, "tail", "s", "-c", "1KiB").stdout) == 1024


@pytest.mark.parametrize("args", [
    ["--data-dir", "{d}", "--json", "-v", "ls"],
    ["ls", "--data-dir", "{d}", "--json", "-v"],
    ["--json", "ls", "--data-dir", "{d}"],
    ["-v", "ls", "--json", "--data-dir", "{d}"],
])
def test_global_options_go_before_or_after_the_command(tmp_path: Path, args: list[str]) -> None:
    d = tmp_path / "d"
    tierfs(d, "mkdir", "logs")
    argv = [arg.format(d=d) for arg in args]
    done = subprocess.run([sys.executable, "-m", "tierfs.cli", *argv], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert [entry["name"] for entry in json.loads(done.stdout)] == ["logs"]
    assert (b"INFO" in done.stderr) == ("-v" in args)  # -v wherever it was given


def test_a_value_given_before_the_command_is_kept_after_it(tmp_path: Path) -> None:
    d = tmp_path / "d"
    done = subprocess.run([sys.executable, "-m", "tierfs.cli", "--data-dir", str(d), "--durability", "vd",
                           "create", "s", "--json"], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["durability"] == "vd"
    assert json.loads(tierfs(d, "stat", "s", "--json").stdout)["durability"] == "vd"


def test_help_ends_with_examples_exit_codes_and_every_environment_variable() -> None:
    import re

    done = subprocess.run([sys.executable, "-m", "tierfs.cli", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    text = done.stdout
    examples, codes, environment = text.index("examples:"), text.index("exit codes:"), text.index("environment:")
    assert examples < codes < environment
    from tierfs.cli.parser import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command in commands:  # one example per command
        assert re.search(rf"^  {re.escape(command)} +(tierfs|source) ", text[examples:codes], re.M), command
    for code in range(7):
        assert re.search(rf"^  {code}  ", text[codes:environment], re.M), code
    repo = Path(__file__).resolve().parent.parent
    used = set()
    for folder in ("tierfs", "fuse", "fsspec_impl"):
        for path in (repo / folder).rglob("*.py"):
            used |= set(re.findall(r"TIERFS_[A-Z0-9_]+[A-Z0-9]", path.read_text()))
    from tierfs.contracts.config import _ENV_NAMES

    used -= {"TIERFS_" + name.upper() for name in _setting_names()} - set(_ENV_NAMES.values())
    missing = sorted(name for name in used if name not in text[environment:])
    assert missing == [], f"tierfs --help does not list {missing}"


def _setting_names() -> list[str]:  # what TIERFS_<SETTING> covers
    import dataclasses

    from tierfs import StoreConfig

    return [field.name for field in dataclasses.fields(StoreConfig)]


def test_each_command_help_ends_with_its_example() -> None:
    done = subprocess.run([sys.executable, "-m", "tierfs.cli", "append", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert 'example:\n  tierfs append logs/app.log "hello"' in done.stdout
    assert "before or after the command" in done.stdout


def _completion_script(tmp_path: Path, shell: str) -> Path:
    script = tmp_path / f"tierfs.{shell}"
    done = subprocess.run([sys.executable, "-m", "tierfs.cli", "completion", shell], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    script.write_text(done.stdout)
    return script


def _store_to_complete(tmp_path: Path) -> Path:
    data_dir = tmp_path / "store"
    for args in (["mkdir", "-p", "logs/app"], ["create", "logs/x"], ["create", "logs/with space"], ["create", "top"]):
        assert tierfs(data_dir, *args).returncode == 0
    return data_dir


# the shell finds tierfs where the user installed it: this venv's bin
SHELL_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def test_bash_completion_completes_commands_options_and_store_paths(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    script = _completion_script(tmp_path, "bash")

    def complete(*words: str) -> list[str]:
        line = " ".join(("tierfs", *words))
        quoted = " ".join(f"'{word}'" for word in words)
        probe = (f"source {script}; COMP_WORDS=(tierfs {quoted}); COMP_CWORD={len(words)}; "
                 f"COMP_LINE='{line}'; COMP_POINT={len(line)}; _tierfs_complete; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=SHELL_ENV)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines() if line]

    assert "append" in complete("ap") and "offload-status" in complete("offload")
    assert "--data-dir" in complete("--data")
    assert "--follow" in complete("tail", "--fol")
    assert "--data-dir" in complete("tail", "--data")  # global options after the command, too
    assert set(complete("--durability", "")) >= {"pd", "vd", "tier2"}
    assert set(complete("completion", "")) >= {"bash", "zsh"}
    data_dir = str(_store_to_complete(tmp_path))
    assert complete("--data-dir", data_dir, "cat", "") == ["logs/", "top"]
    assert complete("--data-dir", data_dir, "tail", "-f", "lo") == ["logs/"]
    assert complete("--data-dir", data_dir, "rm", "logs/") == ["logs/app/", "logs/with\\ space", "logs/x"]
    assert complete(f"--data-dir={data_dir}", "mv", "logs/x", "logs/w") == ["logs/with\\ space"]
    assert complete("--data-dir", data_dir, "stat", "/t") == ["/top"]
    # local files where a local file is meant; no store is created by completing
    (tmp_path / "notes.txt").write_text("x")
    assert complete("--data-dir", str(tmp_path / "new"), "append", "x", "--file", f"{tmp_path}/no") == [
        f"{tmp_path}/notes.txt"]
    assert complete("--data-dir", str(tmp_path / "new"), "cat", "") == []
    assert not (tmp_path / "new").exists()


def test_zsh_completion_completes_store_paths(tmp_path: Path) -> None:
    import shutil

    if shutil.which("zsh") is None:
        pytest.skip("needs zsh")
    script = _completion_script(tmp_path, "zsh")
    data_dir = _store_to_complete(tmp_path)
    # compadd, stood in for: what the store-path function offers, and with which suffix
    probe = (f"autoload -U compinit; compinit -u; source {script}; "
             "compadd() { local suffix=' '; [[ $1 == -S ]] && { suffix=$2; shift 2 }; [[ $1 == -- ]] && shift; "
             "local m; for m in \"$@\"; do print -r -- \"[$m$suffix]\"; done }; "
             f"BUFFER='tierfs --data-dir {data_dir} cat logs/'; PREFIX='logs/'; _tierfs_store_paths")
    result = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, env=SHELL_ENV)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[logs/app/]", "[logs/with space ]", "[logs/x ]"]
    syntax = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_url_names_the_daemon_to_talk_to(tmp_path: Path) -> None:
    from tierfs.testing.harness import start_daemon

    daemon = start_daemon(tmp_path / "served", verbose=False)
    try:
        url = f"unix://{daemon.socket}"
        assert tierfs(tmp_path / "elsewhere", "--url", url, "mkdir", "via-url").returncode == 0
        listed = subprocess.run([sys.executable, "-m", "tierfs.cli", "ls", "--url", url], capture_output=True)
        assert listed.stdout == b"via-url/\n", listed.stderr
        from_env = subprocess.run([sys.executable, "-m", "tierfs.cli", "ls"], capture_output=True,
                                  env={**os.environ, "TIERFS_URL": url})
        assert from_env.stdout == b"via-url/\n", from_env.stderr
        refused = tierfs(tmp_path / "d", "--url", url, "serve")
        assert refused.returncode == 1 and b"give --data-dir instead of --url" in refused.stderr
    finally:
        daemon.stop()
    assert not (tmp_path / "elsewhere").exists()  # --url wins: the data dir was never opened


def test_serve_prints_one_line_when_ready_and_one_when_stopped(tmp_path: Path) -> None:
    import signal

    data_dir = tmp_path / "d"
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        serve = subprocess.Popen([sys.executable, "-m", "tierfs.cli", "serve", "--data-dir", str(data_dir)],
                                 stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    try:
        import time

        deadline = time.monotonic() + 30
        while not stderr_path.read_text() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = stderr_path.read_text().splitlines()
        assert ready == [f"tierfs: serving {data_dir} (pid {serve.pid}): API on {data_dir}/tierfs.sock; "
                         f"stop: Ctrl-C or kill {serve.pid}"], ready
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=60)
    lines = stderr_path.read_text().splitlines()
    assert code == 0 and lines[1:] == [f"tierfs: stopped (pid {serve.pid}): {data_dir} flushed and closed"], lines


def test_version_names_the_parts_a_bug_report_needs_and_help_is_a_command(tmp_path: Path) -> None:
    import importlib.metadata

    shown = tierfs(tmp_path, "--version")
    assert shown.returncode == 0 and shown.stderr == b""
    first, parts = shown.stdout.decode().splitlines()
    assert first == f"tierfs {importlib.metadata.version('tierfs')}"
    for name in ("python", "pyfuse3", "libfuse", "fsspec", "s3fs", "pyspark"):
        assert f"{name} " in parts, parts
    assert "libfuse 3." in parts
    assert tierfs(tmp_path, "help", "ls").stdout == tierfs(tmp_path, "ls", "--help").stdout
    assert tierfs(tmp_path, "help").stdout == tierfs(tmp_path, "--help").stdout
    assert not (tmp_path / "chunks").exists()  # nothing opened


def test_sizes_in_sentences_have_units() -> None:
    from tierfs.contracts.errors import AppendTooLargeError
    from tierfs.contracts.size_text import human_size, readable_size

    assert [readable_size(v) for v in (0, 1, 32, 1536, 64 << 20, 3 * (1 << 30) + 5)] == [
        "0 bytes", "1 byte", "32 bytes", "1.5 KiB", "64 MiB", "3.0 GiB"]
    assert [human_size(v) for v in (900, 1536, 10 * 1024 + 1, 5 << 20)] == ["900", "1.5K", "11K", "5.0M"]
    assert str(AppendTooLargeError(100 << 20, 64 << 20)).startswith("append of 100 MiB (104857600 bytes) exceeds "
                                                                   "max_append_bytes (64 MiB)")
