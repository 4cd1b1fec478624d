"""The options every ``tierfs`` command takes, before or after its name (like git's and
rclone's): which store or daemon (``--data-dir``, ``--url``, ``--tier2``, ``--config``,
...) and the output (``--json``, ``-v``).

Invariant: imports only argparse and ``tierfs.contracts`` (through ``cli.arguments``),
as the parser does.
"""

from __future__ import annotations

import argparse

from tierfs.cli.arguments import daemon_url, data_dir, duration
from tierfs.contracts.config import DURABILITY_LEVELS


def add_global_options(parser: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """The options every command takes, before or after its name. In a subcommand they
    default to SUPPRESS (a value given before the command is kept) and are left out of
    its ``--help``; an option string the subcommand defines itself is its own."""
    taken = set(parser._option_string_actions)

    def add(*flags: str, help_text: str, **kwargs: object) -> None:
        flags = tuple(flag for flag in flags if flag not in taken)
        if not flags:
            return
        if in_subcommand:
            kwargs["default"] = argparse.SUPPRESS
            help_text = argparse.SUPPRESS
        parser.add_argument(*flags, help=help_text, **kwargs)  # type: ignore[arg-type]

    add("--data-dir", metavar="DIR", type=data_dir, help_text="data directory (default ~/.local/share/tierfs)")
    add("--url", metavar="URL", type=daemon_url,
        help_text="talk to the daemon at URL (unix:///path/tierfs.sock or http://HOST:PORT with "
                  "TIERFS_TOKEN) instead of the data dir's")
    add("--tier2", metavar="URL", help_text="tier-2 chunk store URL (default <data-dir>/chunks)")
    add("--tier2-endpoint-url", metavar="URL", help_text="S3-compatible endpoint for an s3:// tier-2")
    add("--offload-to", metavar="URL", help_text="long-term store for offloaded chunks (s3://bucket/prefix)")
    add("--offload-endpoint-url", metavar="URL", help_text="S3-compatible endpoint for an s3:// --offload-to")
    add("--deletion-lag", type=duration, metavar="DURATION",
        help_text="delete the chunk-store copy this long after an offload (default 4h)")
    add("--metadata", metavar="URL", help_text="metadata database: sqlite: (default) or postgresql://...")
    add("--config", metavar="FILE", help_text="TOML config file (default $TIERFS_CONFIG)")
    add("--tls-ca", metavar="FILE", help_text="CA certificate(s) to trust for an https:// daemon (default "
                                             "$TIERFS_CA, else the system's)")
    add("--durability", choices=DURABILITY_LEVELS,
        help_text="durability of the segments created (default pd)")
    add("--takeover", action="store_true",
        help_text="claim tier-2 even if another owner holds it (that owner is fenced)")
    add("--json", action="store_true", help_text="machine-readable output (sizes in bytes)")
    add("-v", "--verbose", action="count", help_text="log more (-vv: debug); errors add their traceback")


def with_global_options(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand (and sub-subcommand) the global options."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in set(action.choices.values()):
                add_global_options(subparser, in_subcommand=True)
                with_global_options(subparser)
