"""The ``tierfs`` command line: its grammar (``build_parser``) and entry point.

Global options choose the store (``--data-dir``, ``--tier2``, ``--config``). ``serve``
runs the daemon; ``mount`` runs it with a FUSE mount, ``umount`` ends that. Every other
subcommand talks to the daemon when one serves the data dir and opens the engine
in-process otherwise, with the same output either way (``commands``, which also
turns errors into messages and exit codes, in one place).

Exit codes: 0 success; 1 the operation failed (message on stderr); 2 bad usage;
3 fsck found damage; 4 the data directory is in use by another process; 5 tier-2 is
owned by another data dir (``takeover``, ``--takeover``: see ``ownership_commands``).

Invariant: parsing imports only argparse and ``tierfs.contracts``, so ``tierfs --help``
and usage errors are quick; trio, the HTTP client, the engine and the server are
imported by the commands that use them (``tests/test_import_hygiene.py``).
"""

from __future__ import annotations

import argparse
import sys

from tierfs.cli.arguments import non_negative_int
from tierfs.contracts.config import DURABILITY_LEVELS
from tierfs.contracts.policy import POLICY_KEYS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tierfs", description="Tiered storage for append-only segments."
    )
    parser.add_argument("--data-dir", help="data directory (default ~/.local/share/tierfs)")
    parser.add_argument("--tier2", help="tier-2 chunk store URL (default <data-dir>/chunks)")
    parser.add_argument(
        "--tier2-endpoint-url", help="S3-compatible endpoint for an s3:// tier-2 (e.g. MinIO)"
    )
    parser.add_argument("--offload-to", metavar="URL",
                        help="long-term store for offloaded chunks (e.g. s3://bucket/prefix)")
    parser.add_argument("--offload-endpoint-url", help="S3-compatible endpoint for an s3:// --offload-to")
    parser.add_argument("--deletion-lag", type=float, metavar="SECONDS",
                        help="delete the chunk-store copy this long after an offload (default 14400)")
    metadata_help = "metadata database: sqlite: (default, in the data dir) or postgresql://..."
    parser.add_argument("--metadata", metavar="URL", help=metadata_help)
    parser.add_argument("--config", help="TOML config file (default $TIERFS_CONFIG)")
    parser.add_argument("--durability", choices=DURABILITY_LEVELS, help="default for new segments")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    takeover_help = "claim tier-2 even if another owner holds it (that owner is fenced)"
    parser.add_argument("--takeover", action="store_true", help=takeover_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text)

    p = add("create", "create an empty segment")
    p.add_argument("path")
    p.add_argument("--durability", dest="segment_durability", choices=DURABILITY_LEVELS)
    p.add_argument("-p", "--parents", action="store_true", help="create missing parent directories")
    p = add("append", "append DATA, a file or stdin as one record; prints its offset")
    p.add_argument("path")
    p.add_argument("data", nargs="?", help="the bytes to append (UTF-8), or - for stdin")
    p.add_argument("--file", help="append the contents of this file")
    p.add_argument("--expected-offset", type=non_negative_int, help="append only if the length is this")
    p = add("cat", "write a segment's bytes to stdout")
    p.add_argument("path")
    p.add_argument("--offset", type=non_negative_int, help="default: the first byte retention kept")
    p.add_argument("--length", type=non_negative_int)
    p.add_argument("--unconfirmed", action="store_true", help="read up to the appended length")
    p = add("stat", "show a segment's or directory's attributes")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p = add("ls", "list a directory")
    p.add_argument("path", nargs="?", default="")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("--json", action="store_true")
    p = add("mkdir", "create a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    for name, text in (("rmdir", "remove an empty directory"), ("seal", "make a segment read-only"),
                       ("unseal", "make a sealed segment appendable again"), ("rm", "delete a segment")):
        add(name, text).add_argument("path")
    p = add("mv", "rename a segment or directory (metadata only)")
    p.add_argument("source")
    p.add_argument("target")
    p = add("concat", "append sealed SOURCEs, in order, to TARGET and remove them "
                      "(metadata only, one transaction); prints the new length")
    p.add_argument("target")
    p.add_argument("sources", nargs="+", metavar="source")
    p = add("sync", "make every appended byte durable; prints the durable length")
    p.add_argument("path", nargs="?")
    p = add("flush", "wait until tier-2 holds every durable byte")
    p.add_argument("path", nargs="?")
    add("fsck", "verify every chunk's CRC32C and the metadata invariants; list orphan objects")
    add("gc", "delete chunk and offload objects no metadata references, older than the grace "
              "period (orphan_grace_s)").add_argument("--dry-run", action="store_true", help="only list them")
    p = add("defrag", "merge a segment's runs of small adjacent chunks into large ones")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p = add("tail", "print the end of a segment; -f follows it as it grows")
    p.add_argument("path")
    p.add_argument("-f", "--follow", action="store_true")
    group = p.add_mutually_exclusive_group()
    group.add_argument("-n", "--lines", type=non_negative_int, default=10, help="last LINES lines (default 10)")
    group.add_argument("-c", "--bytes", type=non_negative_int, help="last BYTES bytes")
    p = add("offload", "offload a segment's sealed chunks to the long-term store (progress on stderr)")
    p.add_argument("path")
    p.add_argument("--up-to", type=non_negative_int, metavar="OFFSET", help="only chunks that end at or before OFFSET")
    p.add_argument("--no-wait", action="store_true", help="start it and return")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p = add("offload-status", "NOT_RUN / RUNNING / SUCCESS / ERROR of a segment's offload")
    p.add_argument("path")
    p.add_argument("--wait", action="store_true", help="wait until it is no longer RUNNING")
    p.add_argument("--json", action="store_true")
    p = add("policy", "set or show offload and retention policies of a directory")
    policy_sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = policy_sub.add_parser("set", help="set KEY=VALUE (VALUE none unsets); keys: " + ", ".join(POLICY_KEYS))
    q.add_argument("path", help="a directory ('' or / for the root)")
    q.add_argument("settings", nargs="+", metavar="KEY=VALUE")
    q.add_argument("--json", action="store_true")
    q = policy_sub.add_parser("get", help="the policy in effect, and where each value comes from")
    q.add_argument("path")
    q.add_argument("--json", action="store_true")
    add("takeover", "claim tier-2 for this data dir, fencing its current owner; prints the new epoch")
    p = add("owner", "who owns tier-2, what this data dir claimed last, and its lost+found")
    p.add_argument("--json", action="store_true")
    p = add("restore", "rebuild the data dir from the metadata backups on tier-2 and own that tier-2")
    p.add_argument("--tier2", default=argparse.SUPPRESS, help="the tier-2 URL to restore from")
    p.add_argument("--data-dir", default=argparse.SUPPRESS, help="the data dir to rebuild")
    p = add("metadata", "export or import the store's metadata (docs/METADATA_FORMAT.md)")
    metadata_sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    metadata_sub.add_parser("export", help="write the metadata to FILE (- for stdout)").add_argument("file")
    metadata_sub.add_parser("import", help="load FILE (- for stdin) into an empty store").add_argument("file")
    p = add("serve", "run the daemon: HTTP API on <data-dir>/tierfs.sock until SIGTERM")
    p.add_argument("--takeover", action="store_true", default=argparse.SUPPRESS, help=takeover_help)
    p.add_argument("--metadata", metavar="URL", default=argparse.SUPPRESS, help=metadata_help)
    p.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (bearer token required)")
    p = add("mount", "run the daemon with the store mounted at MOUNTPOINT (FUSE); the API keeps serving")
    p.add_argument("--takeover", action="store_true", default=argparse.SUPPRESS, help=takeover_help)
    p.add_argument("--metadata", metavar="URL", default=argparse.SUPPRESS, help=metadata_help)
    p.add_argument("mountpoint")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (logs to stderr)")
    p.add_argument("--listen", metavar="HOST:PORT", help="also listen on TCP (bearer token required)")
    p.add_argument("--page-cache", action="store_true",
                   help="read and write through the kernel page cache instead of direct I/O "
                        "(needed for mmap; slower, see docs/PERFORMANCE.md)")
    p.add_argument("--attr-timeout", type=float, default=None, metavar="SECONDS",
                   help="how long the kernel may cache attributes (default 60, 1 on a cluster "
                        "daemon; the kernel hears of every change at once anyway)")
    p.add_argument("--allow-other", action="store_true",
                   help="let other users use the mount (the kernel checks the stored modes "
                        "and owners; a non-root owner needs user_allow_other in /etc/fuse.conf)")
    p = add("umount", "unmount a tierfs mount; its daemon flushes, closes and exits")
    p.add_argument("mountpoint")
    return parser


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and usage errors exit here
    from tierfs.cli.commands import execute

    return execute(args)


def main() -> None:
    sys.exit(run())
