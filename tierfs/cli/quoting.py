"""Names as ``tierfs ls`` prints them: as GNU ``ls`` quotes them on a terminal
(``shell-escape``: quoted only when a shell would need it, control characters as
``$'\\n'``), raw into a pipe, except control characters, which are never printed raw
(a newline would fake an entry, an escape sequence drive the terminal). Names with
control characters can no longer be made (``contracts.names``), but older stores may
hold some.
"""

from __future__ import annotations

import re

_SAFE = re.compile(r"[A-Za-z0-9._+,/:@%=^-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _escaped(character: str) -> str:
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x1b": "\\E"}
    return named.get(character, f"\\{ord(character):03o}")


def quoted(name: str, terminal: bool) -> str:
    if not _CONTROL.search(name) and (not terminal or _SAFE.fullmatch(name)):
        return name
    pieces = re.split(r"([\x00-\x1f\x7f]+)", name)
    out = []
    for index, piece in enumerate(pieces):
        if not piece:
            continue
        if index % 2:  # a run of control characters
            out.append("$'" + "".join(_escaped(c) for c in piece) + "'")
        elif _SAFE.fullmatch(piece):
            out.append(piece)
        elif "'" not in piece:
            out.append(f"'{piece}'")
        elif not re.search(r'[\\"$`!]', piece):
            out.append(f'"{piece}"')
        else:
            out.append("'" + piece.replace("'", "'\\''") + "'")
    return "".join(out)
