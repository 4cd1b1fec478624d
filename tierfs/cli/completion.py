"""``tierfs completion bash|zsh|tcsh``: a shell completion script generated from the
parser itself (shtab), so every command, option and choice completes as ``--help``
lists it; store paths complete from the store (``tierfs ls`` of the directory typed so
far, through ``__complete-path``), local files and directories from the disk. Use:
``source <(tierfs completion bash)``, or write it to
``~/.local/share/bash-completion/completions/tierfs``.

Invariants:
- Generated from the parser the command was parsed with (``build_parser()``) at run
  time: it never goes stale.
- Store paths complete with the global options typed on the line (``--data-dir``,
  ``--url``, ...), so they come from the store the command will run against; the helper
  runs under ``timeout``, so a slow store never hangs the shell.
"""

from __future__ import annotations

import argparse

import shtab

# the helper's global options that choose the store: passed on from the line being typed
_STORE_OPTIONS = ("--data-dir", "--url", "--config", "--metadata", "--tier2", "--tier2-endpoint-url")
_STORE_PATH_DESTS = {"path", "paths", "source", "target", "sources", "to"}
_FILE_DESTS = {"file", "config"}
_DIRECTORY_DESTS = {"data_dir", "mountpoint"}
_NOT_STORE_COMMANDS = {"serve", "mount", "umount", "completion", "metadata"}
COMPLETION_TIMEOUT_S = 3

_BASH = r"""
_tierfs_store_paths() {
  local -a typed options=()
  local i word
  # the line split at blanks only (COMP_WORDS splits --url unix:///x at the colons)
  read -ra typed <<< "${COMP_LINE:0:COMP_POINT}"
  for ((i = 1; i < ${#typed[@]} - 1; i++)); do
    word="${typed[i]/#\~/$HOME}"
    case "$word" in
      OPTIONS) options+=("$word" "${typed[i+1]/#\~/$HOME}"); ((i++)) ;;
      OPTIONS_EQ) options+=("${word/=\~/=$HOME}") ;;
    esac
  done
  # the word as typed (logs/a\ b) -> the name (logs/a b) -> each match quoted for the line
  timeout TIMEOUT tierfs __complete-path "${options[@]}" -- "${1//\\/}" 2>/dev/null |
    while IFS= read -r word; do printf '%q\n' "$word"; done
}
"""
# a directory completes without the space after it, so the next name can follow
_BASH_WRAPPER = r"""
_tierfs_complete() {
  _shtab_tierfs "$@"
  if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == */ ]]; then compopt -o nospace 2>/dev/null; fi
  return 0
}
complete -o bashdefault -F _tierfs_complete tierfs
"""
_ZSH = r"""
_tierfs_store_paths() {
  local -a line options found
  local i
  line=(${(z)BUFFER})
  for ((i = 2; i <= ${#line}; i++)); do
    case "${line[i]}" in
      OPTIONS) options+=("${line[i]}" "${(Q)line[i+1]}"); ((i++)) ;;
      OPTIONS_EQ) options+=("${(Q)line[i]}") ;;
    esac
  done
  found=("${(@f)$(timeout TIMEOUT tierfs __complete-path "${options[@]}" -- "$PREFIX" 2>/dev/null)}")
  found=(${found:#})
  compadd -S '' -- ${(M)found:#*/}
  compadd -- ${found:#*/}
}
"""


def _fill(template: str) -> str:
    return (template.replace("OPTIONS_EQ", "|".join(f"{option}=*" for option in _STORE_OPTIONS))
            .replace("OPTIONS", "|".join(_STORE_OPTIONS)).replace("TIMEOUT", str(COMPLETION_TIMEOUT_S)))


STORE_PATH = {"bash": "_tierfs_store_paths", "zsh": "_tierfs_store_paths", "tcsh": "",
              "preamble": {"bash": _fill(_BASH), "zsh": _fill(_ZSH)}}


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                found += [(name, subparser), *_subparsers(subparser)]
    return found


def _mark_completions(parser: argparse.ArgumentParser) -> None:
    """What each argument completes to; the global options offered after the command
    too (they are accepted there, only left out of each command's --help)."""
    global_help = {action.dest: action.help for action in parser._actions if action.option_strings}
    for name, each in [("", parser), *_subparsers(parser)]:
        for action in each._actions:
            if action.help == argparse.SUPPRESS and action.option_strings and action.dest in global_help:
                action.help = global_help[action.dest]
            if action.dest in _FILE_DESTS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
            elif action.dest in _DIRECTORY_DESTS:
                action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
            elif action.dest in _STORE_PATH_DESTS and name and name not in _NOT_STORE_COMMANDS:
                action.complete = STORE_PATH  # type: ignore[attr-defined]


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    _mark_completions(parser)
    script: str = shtab.complete(parser, shell=shell)
    if shell == "bash":
        script = script.rstrip().removesuffix("complete -o bashdefault -F _shtab_tierfs tierfs") + _BASH_WRAPPER
    return script if script.endswith("\n") else script + "\n"
