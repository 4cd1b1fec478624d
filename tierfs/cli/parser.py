"""The ``tierfs`` command line: its grammar (``build_parser``) and entry point.

Global options choose the store or the daemon (``--data-dir``, ``--url``, ``--tier2``,
``--config``, ...) and the output (``--json``, ``-v``); like git's and rclone's they
are accepted before or after the command (``tierfs ls --data-dir D``). ``serve`` runs
the daemon; ``mount`` runs it with a FUSE mount, ``umount`` ends that. Every other
subcommand talks to the daemon when one serves the data dir and opens the engine
in-process otherwise, with the same output either way (``commands``; ``execution``
turns errors into one line and an exit code, in one place). Sizes and durations take
units (``arguments``).

Exit codes (``help_text.EXIT_CODES``): 0 success; 1 the operation failed (one line on
stderr); 2 bad usage (one line: the problem and the usage); 3 fsck found damage; 4 the
data directory is in use by another process; 5 tier-2 is owned by another data dir;
6 the data dir's disk is full.

Invariant: parsing imports only argparse and ``tierfs.contracts``, so ``tierfs --help``
and usage errors are quick; trio, the HTTP client, the engine and the server are
imported by the commands that use them (``tests/test_import_hygiene.py``).
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from tierfs.cli.arguments import duration, host_port, policy_setting, size
from tierfs.cli.global_options import add_global_options, with_global_options
from tierfs.cli.help_text import command_epilog, main_epilog
from tierfs.cli.tail.options import add_tail_arguments
from tierfs.contracts.policy import POLICY_KEYS
from tierfs.contracts.units import DURATION_HELP, SIZE_HELP

EXIT_USAGE = 2
# The collector's generations for every command, set as it starts: 50,000 young objects,
# not Python's 700. In a daemon with a thousand streams the default collected every few
# milliseconds, promoting every request then in flight to the old generations, so full
# passes over all the connections' objects came every 2-3 s and took 150-290 ms (the p99
# of every follower and append); now ~0. And a command's start-up (a few hundred modules
# imported) ran ~120 collections, ~40 ms of a daemon's ~0.35 s of imports; now ~15.
GC_THRESHOLDS = (50_000, 20, 100)
AddCommand = Callable[[str, str], argparse.ArgumentParser]  # name, help -> its parser


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line: the problem, then the usage."""

    def error(self, message: str) -> NoReturn:
        # argparse's words for "--follow=bogus" and "-x" glued to a flag, in plain ones
        message = re.sub(r"ignored explicit argument '(.*)'", r"does not take the value '\1' (the usage shows "
                         r"what it takes)", message)
        usage = " ".join(self.format_usage().split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; {usage}\n")


def _help_only_as_long_option(parser: argparse.ArgumentParser) -> None:
    """``--help`` stays help; ``-h`` is free for the command (``ls -lh``)."""
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            action.option_strings = ["--help"]
    parser._option_string_actions.pop("-h", None)


def _segment_commands(new: AddCommand) -> None:
    p = new("create", "create an empty segment")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true", help="create missing parent directories")
    p = new("append", "append DATA, a file or stdin as one record; prints its offset")
    p.add_argument("path")
    p.add_argument("data", nargs="?", help="the bytes to append (UTF-8), or - for stdin")
    p.add_argument("--file", help="append the contents of this file")
    p.add_argument("--expected-offset", type=size, help="append only if the length is this")
    p = new("cat", "write a segment's bytes to stdout")
    p.add_argument("path")
    p.add_argument("--offset", type=size, help="default: the first byte retention kept")
    p.add_argument("--length", type=size, help="bytes to read, or a size: " + SIZE_HELP)
    p.add_argument("--unconfirmed", action="store_true", help="read up to the appended length")
    new("stat", "show a segment's or directory's attributes").add_argument("path")
    p = new("ls", "list a directory")
    p.add_argument("path", nargs="?", default="")
    p.add_argument("-l", "--long", action="store_true")
    _help_only_as_long_option(p)  # -h is ls's own, as GNU ls has it
    p.add_argument("-h", "--human-readable", dest="human", action="store_true", help="with -l: sizes as 1.5K, 12M")
    p.add_argument("-a", "--all", action="store_true", help="accepted: every entry is always listed")
    p = new("mkdir", "create a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    for name, text in (("rmdir", "remove an empty directory"), ("seal", "make a segment read-only"),
                       ("unseal", "make a sealed segment appendable again"), ("rm", "delete a segment")):
        new(name, text).add_argument("path")
    p = new("mv", "rename a segment or directory (metadata only)")
    p.add_argument("source")
    p.add_argument("target")
    p = new("concat", "append sealed SOURCEs, in order, to TARGET and remove them "
                      "(metadata only, one transaction); prints the new length")
    p.add_argument("target")
    p.add_argument("sources", nargs="+", metavar="source")
    new("sync", "make every appended byte durable; prints the durable length").add_argument("path", nargs="?")
    new("flush", "wait until tier-2 holds every durable byte").add_argument("path", nargs="?")
    new("fsck", "verify every chunk's CRC32C and the metadata invariants; list orphan objects").add_argument(
        "--repair", action="store_true",
        help="a damaged journal: move the damaged bytes, and what cannot follow them, to lost+found and keep "
             "every intact frame (the data dir must not be open elsewhere)")
    p = new("gc", "delete chunk and offload objects no metadata references, older than the grace "
                  "period (orphan_grace_s)")
    p.add_argument("--dry-run", action="store_true", help="only list them")
    p.add_argument("--older-owners", action="store_true",
                   help="also those of the owners before a takeover from another data dir (kept by default: "
                        "that data dir may still reference them)")
    new("defrag", "merge a segment's runs of small adjacent chunks into large ones").add_argument("path")
    add_tail_arguments(new("tail", "print the end of segments, as GNU tail; -f/-F follow them as they grow "
                                   "(woken by each durable append, never polling)"))


def _with_actions(add: AddCommand, name: str, help_text: str) -> Any:
    """``tierfs NAME ACTION ...``: the command's parser for its actions (``args.action``)."""
    return add(name, help_text).add_subparsers(dest="action", required=True, metavar="ACTION", prog=f"tierfs {name}")


def _store_commands(add: AddCommand) -> None:
    p = add("offload", "offload a segment's sealed chunks to the long-term store (progress on stderr)")
    p.add_argument("path")
    p.add_argument("--up-to", type=size, metavar="OFFSET", help="only chunks that end at or before OFFSET")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p = add("offload-status", "NOT_RUN / RUNNING / SUCCESS / ERROR of a segment's offload")
    p.add_argument("path")
    p.add_argument("--wait", action="store_true", help="wait until it is no longer RUNNING")
    policy_sub = _with_actions(add, "policy", "set or show offload and retention policies of a directory")
    q = policy_sub.add_parser(
        "set", help="set KEY=VALUE (VALUE none unsets); keys: " + ", ".join(POLICY_KEYS),
        description=f"set KEY=VALUE on a directory (none unsets). Keys: {', '.join(POLICY_KEYS)}. "
                    f"*_bytes: bytes or a size ({SIZE_HELP}). *_s: {DURATION_HELP}.",
        epilog=command_epilog("policy"), formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("path", help="a directory ('' or / for the root)")
    q.add_argument("settings", nargs="+", metavar="KEY=VALUE", type=policy_setting)
    q = policy_sub.add_parser("get", help="the policy in effect, and where each value comes from")
    q.add_argument("path")
    lost_sub = _with_actions(add, "lost-found", "what the data dir holds aside (acknowledged bytes that could not "
                                                "stay where they were), and putting it back")
    lost_sub.add_parser("list", help="one line per entry: path, segment, offsets, bytes, owner epoch, why")
    q = lost_sub.add_parser("restore", help="append an entry's appends again at the end of their segment, "
                                            "each once (writer identities), then remove the entry")
    q.add_argument("entry", help="as lost-found list shows it")
    q.add_argument("--to", metavar="SEGMENT", help="append to this segment instead (it must exist)")
    q.add_argument("--keep", action="store_true", help="keep the entry after restoring it")
    add("takeover", "claim tier-2 for this data dir, fencing its current owner; prints the new epoch")
    add("owner", "who owns tier-2, what this data dir claimed last, and its lost+found")
    add("restore", "rebuild the data dir (--data-dir) from the metadata backups on tier-2 (--tier2) "
                   "and own that tier-2")
    cluster_sub = _with_actions(add, "cluster", "a cluster's hosts and containers: who holds which lease, heartbeats, "
                                                "flush backlog and lost+found, read from its PostgreSQL database and "
                                                "the daemons' metrics")
    cluster_sub.add_parser("status", help="every daemon and container, as tables (--json: one document)")
    q = cluster_sub.add_parser("drain", help="move every container off DAEMON (flushed, nothing lost) and wait "
                                             "until it holds none; it takes none until undrain or a clean stop")
    q.add_argument("daemon", metavar="DAEMON", help="a daemon id or URL, as tierfs cluster status shows it")
    q.add_argument("--wait", type=duration, default=120.0, metavar="DURATION",
                   help="how long to wait for its containers to move (default 2m)")
    cluster_sub.add_parser("undrain", help="let DAEMON hold its share of the containers again").add_argument(
        "daemon", metavar="DAEMON", help="a daemon id or URL")
    metadata_sub = _with_actions(add, "metadata", "export or import the store's metadata (docs/METADATA_FORMAT.md)")
    metadata_sub.add_parser("export", help="write the metadata to FILE (- for stdout)").add_argument("file")
    metadata_sub.add_parser("import", help="load FILE (- for stdin) into an empty store").add_argument("file")


def _daemon_commands(add: AddCommand) -> None:
    listen_help = "also listen on TCP (bearer token required, in <data-dir>/token)"
    p = add("serve", "run the daemon: HTTP API on <data-dir>/tierfs.sock until SIGTERM or Ctrl-C; "
                     "prints one line when it serves and one when it stopped")
    p.add_argument("--listen", metavar="HOST:PORT", type=host_port, help=listen_help)
    _tls_options(p)
    p = add("mount", "run the daemon with the store mounted at MOUNTPOINT (FUSE; an empty directory); "
                     "the API keeps serving. Prints one line once mounted")
    p.add_argument("mountpoint")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (logs to stderr)")
    p.add_argument("--listen", metavar="HOST:PORT", type=host_port, help=listen_help)
    _tls_options(p)
    p.add_argument("--page-cache", action="store_true",
                   help="read and write through the kernel page cache instead of direct I/O "
                        "(needed for mmap; slower, see docs/PERFORMANCE.md)")
    p.add_argument("--attr-timeout", type=duration, default=None, metavar="DURATION",
                   help="how long the kernel may cache attributes (default 60s, 1s on a cluster "
                        "daemon; the kernel hears of every change at once anyway)")
    p.add_argument("--allow-other", action="store_true",
                   help="let other users use the mount (the kernel checks the stored modes "
                        "and owners; a non-root owner needs user_allow_other in /etc/fuse.conf)")
    add("umount", "unmount a tierfs mount; waits until its daemon flushed, closed and exited"
        ).add_argument("mountpoint")
    add("completion", "print a shell completion script: source <(tierfs completion bash)"
        ).add_argument("shell", choices=("bash", "zsh", "tcsh"))


def _tls_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", metavar="FILE", help="serve --listen (and a cluster daemon's append port) over "
                                                      "TLS with this certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")


class _Version(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from tierfs.cli.version import version_text

        sys.stdout.write(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tierfs", usage="tierfs [GLOBAL OPTIONS] COMMAND [ARGS] (tierfs COMMAND --help)",
        description="Tiered storage for append-only segments.", epilog=main_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_options(parser, in_subcommand=False)
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the versions of tierfs and of the parts it runs on, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", prog="tierfs")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, epilog=command_epilog(name),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    _segment_commands(add)
    _store_commands(add)
    _daemon_commands(add)
    with_global_options(parser)  # last: a subcommand's own -v or -q stays its own
    return parser


def _help_as_option(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``tierfs [GLOBAL OPTIONS] help [COMMAND]`` (as git has it) is ``[COMMAND] --help``."""
    index = 0
    while index < len(argv) and argv[index].startswith("-"):  # global options and their values
        action = parser._option_string_actions.get(argv[index].split("=", 1)[0])
        takes_value = action is not None and action.nargs != 0 and "=" not in argv[index]
        index += 2 if takes_value else 1
    if argv[index:index + 1] != ["help"]:
        return argv
    return [*argv[:index], *argv[index + 1:index + 2], "--help"]


def run(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["__complete-path"]:  # the completion scripts' helper, not a user command
        from tierfs.cli.path_completion import complete_path

        return complete_path(argv[1:])
    parser = build_parser()
    argv = _help_as_option(parser, argv)
    args = parser.parse_args(argv)  # --help and usage errors exit here
    if args.command == "completion":
        from tierfs.cli.completion import completion_script

        sys.stdout.write(completion_script(parser, args.shell))
        return 0
    from tierfs.cli.execution import execute

    return execute(args)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    sys.exit(run())
