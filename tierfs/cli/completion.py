"""``tierfs completion bash|zsh|tcsh``: a shell completion script generated from the
parser itself (shtab), so every command, option and choice completes as ``--help``
lists it. Use: ``source <(tierfs completion bash)``, or write it to
``~/.local/share/bash-completion/completions/tierfs``.

Invariant: generated from the parser the command was parsed with (``build_parser()``)
at run time: it never goes stale.
"""

from __future__ import annotations

import argparse

import shtab


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    script: str = shtab.complete(parser, shell=shell)
    return script if script.endswith("\n") else script + "\n"
