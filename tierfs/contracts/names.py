"""Segment and directory names.

Invariants:
- A canonical name is a '/'-joined sequence of components with no leading or trailing
  slash; the root directory is the empty string.
- Every component is 1..255 UTF-8 bytes, is not '.' or '..', and holds no '/' and no
  control character (0x00-0x1F, 0x7F): a newline, a tab or an escape sequence in a name
  would fake entries in listings and drive terminals.
- A component over 255 bytes, or a name over ``MAX_NAME_BYTES``, is ``NameTooLongError``
  (ENAMETOOLONG on the mount, 400 ``name_too_long`` on the API), a subclass of
  ``InvalidNameError``.
- Validation happens before any state change, so a bad name changes nothing.
- Every canonical name is the user's. A segment deleted or replaced while a descriptor
  holds it lives on under a *detached* name (``detached_name``) until the last hold
  goes: those start with a control character, so no user name is ever one, listings
  never show them (they are in no directory) and the store deletes them when it opens
  (nothing can hold them then).
"""

from __future__ import annotations

from tierfs.contracts.errors import InvalidNameError, NameTooLongError

MAX_COMPONENT_BYTES = 255  # the POSIX NAME_MAX most filesystems and tools assume
# The kernel applies PATH_MAX (4096) to the path a caller gives, which may be relative to
# a directory deep inside the mount, so a name below the mount root may be longer: the
# store's own bound is only there to keep one name a reasonable database key.
MAX_NAME_BYTES = 32768


def canonical(name: str, *, allow_root: bool = False) -> str:
    """Return the canonical form of ``name`` or raise :class:`InvalidNameError`.

    One leading '/' and one trailing '/' are accepted and dropped; anything else that
    is not a plain component is rejected rather than silently repaired.
    """
    if not isinstance(name, str):
        raise InvalidNameError(repr(name), "a name must be a string")
    stripped = name
    if stripped.startswith("/"):
        stripped = stripped[1:]
    if stripped.endswith("/"):
        stripped = stripped[:-1]
    if stripped == "":
        if allow_root:
            return ""
        raise InvalidNameError(name, "the name is empty (the root is a directory)")
    control = next((c for c in stripped if c < " " or c == "\x7f"), None)
    if control is not None:
        raise InvalidNameError(name, f"control characters are not allowed (found {control!r})")
    if len(stripped.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise NameTooLongError(name, f"longer than {MAX_NAME_BYTES} bytes")
    for component in stripped.split("/"):
        if component == "":
            raise InvalidNameError(name, "empty path component ('//' or a stray '/')")
        if component in (".", ".."):
            raise InvalidNameError(name, f"'{component}' components are not allowed")
        if len(component.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise NameTooLongError(name, f"component longer than {MAX_COMPONENT_BYTES} bytes")
    return stripped


def parent_of(name: str) -> str:
    """The canonical parent directory of a canonical name ('' for top level)."""
    head, _, _ = name.rpartition("/")
    return head


def basename(name: str) -> str:
    return name.rpartition("/")[2]


def is_within(name: str, directory: str) -> bool:
    """True when ``name`` lies strictly below ``directory`` (canonical names)."""
    if directory == "":
        return name != ""
    return name.startswith(directory + "/")


# The top component of every detached name: it holds a control character, so
# ``canonical`` refuses it, and it is no directory, so nothing lists what is under it.
DETACHED_DIRECTORY = "\x01detached"


def detached_name(segment_id: int) -> str:
    """Where a segment deleted or replaced while held lives until its last hold goes."""
    return f"{DETACHED_DIRECTORY}/{segment_id}"


def is_detached(name: str) -> bool:
    return name.startswith(DETACHED_DIRECTORY + "/")
