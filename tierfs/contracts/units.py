"""Sizes and durations as people write them: ``64MiB``, ``1GiB``, ``4k``, ``30s``, ``4h``.

One grammar for every place a size or a duration is taken: command-line flags, the
``TIERFS_*`` environment, the TOML file, ``StoreConfig(...)`` and policy values.

- Sizes: a number (bytes), or a number and a unit: ``B``; ``K``/``KiB``, ``M``/``MiB``,
  ``G``/``GiB``, ``T``/``TiB``, ``P``/``PiB`` (powers of 1024, as GNU tools and rclone
  read ``4k``); ``KB``, ``MB``, ``GB``, ``TB``, ``PB`` (powers of 1000). Case does not
  matter, a space may separate the number and the unit, a fraction is allowed when
  the result is a whole number of bytes (``1.5GiB``).
- Durations: a number (seconds), or one or more number-unit pairs: ``ms``, ``s``, ``m``
  (minutes), ``h``, ``d``, ``w`` (``1h30m``, ``500ms``, ``4h``).
- Printed back (``format_size``, ``format_duration``) in the same notation, exactly:
  what is printed parses back to the same value.

Invariant: parsing is pure and raises ``InvalidArgumentError`` naming the setting and
what would be accepted; nothing else in tierfs parses units.
"""

from __future__ import annotations

import math
import re

from tierfs.contracts.errors import InvalidArgumentError

# binary units (K, KiB, ...) and decimal ones (KB, ...), by lower-case spelling
_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtp", start=1):
    _SIZE_UNITS[_letter] = _SIZE_UNITS[_letter + "ib"] = 1024**_power
    _SIZE_UNITS[_letter + "b"] = 1000**_power
# printed back with the largest binary unit that divides the value exactly
_SIZE_PRINT_UNITS = (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PRINT_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(_NUMBER + r"\s*([a-z]*)")
_DURATION_PART_RE = re.compile(_NUMBER + r"\s*(ms|s|m|h|d|w)")

SIZE_HELP = "4k, 64MiB, 1GiB; K, M, G mean KiB, MiB, GiB, and KB, MB, GB powers of 1000"
DURATION_HELP = "seconds, or with units: 500ms, 30s, 5m, 4h, 1h30m, 30d"


def parse_size(raw: object, setting: str = "size") -> int:
    """Bytes from an int or a text such as ``4k``, ``64MiB``, ``1.5GiB``; >= 0."""
    if isinstance(raw, bool):
        raise InvalidArgumentError(f"{setting}: {raw!r} is not a whole number of bytes or a size with a unit ({SIZE_HELP})")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        if not raw.is_integer():
            raise InvalidArgumentError(f"{setting}: {raw!r} is not a whole number of bytes")
        value = int(raw)
    else:
        text = str(raw).strip().lower()
        if text.startswith("-"):
            raise InvalidArgumentError(f"{setting}: must be >= 0, not {raw!r}")
        match = _SIZE_RE.fullmatch(text)
        if match is None or match.group(2) not in _SIZE_UNITS:
            raise InvalidArgumentError(f"{setting}: {raw!r} is not a whole number of bytes or a size with a unit ({SIZE_HELP})")
        number, unit = match.group(1), _SIZE_UNITS[match.group(2)]
        if "." in number:
            exact = float(number) * unit
            if not exact.is_integer():
                raise InvalidArgumentError(f"{setting}: {raw!r} is not a whole number of bytes")
            value = int(exact)
        else:
            value = int(number) * unit
    if value < 0:
        raise InvalidArgumentError(f"{setting}: must be >= 0, not {raw!r}")
    return value


def parse_duration(raw: object, setting: str = "duration") -> float:
    """Seconds from a number or a text such as ``30s``, ``4h``, ``1h30m``, ``500ms``; >= 0."""
    if isinstance(raw, bool):
        raise InvalidArgumentError(f"{setting}: {raw!r} is not a duration ({DURATION_HELP})")
    if isinstance(raw, (int, float)):
        seconds = float(raw)
    else:
        text = str(raw).strip().lower()
        try:
            seconds = float(text)  # a bare number: seconds
        except ValueError:
            parts = list(_DURATION_PART_RE.finditer(text))
            covered = "".join(part.group(0) for part in parts)
            if not parts or covered.replace(" ", "") != text.replace(" ", ""):
                raise InvalidArgumentError(f"{setting}: {raw!r} is not a duration ({DURATION_HELP})") from None
            seconds = sum(float(part.group(1)) * _DURATION_UNITS[part.group(2)] for part in parts)
    if not math.isfinite(seconds):
        raise InvalidArgumentError(f"{setting}: {raw!r} is not a duration ({DURATION_HELP})")
    if seconds < 0:
        raise InvalidArgumentError(f"{setting}: must be >= 0, not {raw!r}")
    return seconds


def parse_whole_seconds(raw: object, setting: str = "duration") -> int:
    """``parse_duration`` for settings kept in whole seconds (policies)."""
    seconds = parse_duration(raw, setting)
    if not seconds.is_integer():
        raise InvalidArgumentError(f"{setting}: {raw!r} is not a whole number of seconds")
    return int(seconds)


def format_size(value: int) -> str:
    """``1073741824`` -> ``1GiB``; a value no binary unit divides stays in bytes."""
    for unit, factor in _SIZE_PRINT_UNITS:
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def format_duration(seconds: float) -> str:
    """``14400`` -> ``4h``, ``5400`` -> ``1h30m``, ``0.5`` -> ``500ms``, ``0`` -> ``0s``."""
    if not seconds:
        return "0s"
    if not float(seconds).is_integer():
        millis = seconds * 1000
        return f"{millis:g}ms" if float(millis).is_integer() else f"{seconds:g}s"
    remaining, parts = int(seconds), []
    for unit, factor in _DURATION_PRINT_UNITS:
        if remaining >= factor:
            parts.append(f"{remaining // factor}{unit}")
            remaining %= factor
    return "".join(parts)
