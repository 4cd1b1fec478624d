"""A reference model of a tierfs store: plain dicts of what should exist, for checking a
real store (in-process or a daemon) under random operations (``testing/model_run.py``).

The model is written from the documented API (contracts/api.py, docs/operations.md "Durability"),
not from the engine's code: each operation either returns what the real store must
return or raises ``Expected(code)`` with the stable error ``code`` the real store must
raise for the same bad call, having changed nothing (invariant 5).

What a crash may take away is modelled exactly as promised:

- ``ModelSegment.must_survive_bytes`` is the length no crash may cut: every
  acknowledged PD or tier2 append, every byte made durable by ``sync``/``flush``/``concat``,
  and every byte a reader was shown (no reader sees a byte a crash can take away).
- A VD append survives once the sync interval (and the fsync) has passed since its
  acknowledgement (``sync_interval_passed``: the agreed shape's "VD survives a process
  crash after the sync interval").
- Above that a VD segment may lose a suffix on kill -9, but only whole appends
  (``append_ends``): what remains is a prefix of the acknowledged bytes, never a torn
  or reordered append. ``crashed`` applies what the restarted store reports.
- An append in flight at the kill (``in_flight``) is either all there or not at all.
- A clean restart loses nothing.

Invariants of the model itself: names are canonical; a segment's bytes only grow
except through ``crashed``; directories hold their entries by name prefix.
"""

from __future__ import annotations

import dataclasses

from tierfs.contracts.config import DURABILITY_LEVELS


class Expected(Exception):
    """The error the real store must raise, by its stable code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclasses.dataclass
class ModelSegment:
    durability: str
    data: bytearray = dataclasses.field(default_factory=bytearray)
    sealed: bool = False
    must_survive_bytes: int = 0
    append_ends: list[int] = dataclasses.field(default_factory=list)
    in_flight: bytes = b""  # an append whose answer a kill -9 cut off: whole or absent
    vd_acks: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (time, end)

    def confirm(self, length: int) -> None:
        self.must_survive_bytes = max(self.must_survive_bytes, min(length, len(self.data)))


def canonical(name: str, *, allow_root: bool = False) -> str:
    """The documented name rules: one leading and one trailing '/' are dropped; empty
    names (other than the root where allowed), empty components, '.' and '..' are bad."""
    stripped = name[1:] if name.startswith("/") else name
    stripped = stripped[:-1] if stripped.endswith("/") else stripped
    if stripped == "" and allow_root:
        return ""
    if stripped == "" or any(part in ("", ".", "..") for part in stripped.split("/")):
        raise Expected("invalid_name")
    return stripped


def parent_of(name: str) -> str:
    return name.rpartition("/")[0]


class ReferenceModel:
    def __init__(self) -> None:
        self.segments: dict[str, ModelSegment] = {}
        self.directories: set[str] = set()

    # ------------------------------------------------------------------ lookups
    def segment(self, name: str) -> ModelSegment:
        canonical_name = canonical(name)
        if canonical_name in self.segments:
            return self.segments[canonical_name]
        if canonical_name in self.directories:
            raise Expected("is_a_directory")
        raise Expected("not_found")

    def stat(self, name: str) -> str:
        """'directory' or 'segment'."""
        canonical_name = canonical(name, allow_root=True)
        if canonical_name == "" or canonical_name in self.directories:
            return "directory"
        self.segment(canonical_name)
        return "segment"

    def _taken(self, name: str) -> bool:
        return name in self.segments or name in self.directories

    def _require_directory(self, name: str) -> None:
        if name and name not in self.directories:
            raise Expected("not_a_directory" if name in self.segments else "not_found")

    def _entries_below(self, name: str) -> list[str]:
        prefix = name + "/"
        return [n for n in [*self.segments, *self.directories] if n.startswith(prefix)]

    def entries(self, directory: str) -> list[tuple[str, str]]:
        """(name, type) of the entries directly inside ``directory``, sorted by name."""
        canonical_dir = canonical(directory, allow_root=True)
        self._require_directory(canonical_dir)
        found = [(n, "directory") for n in self.directories if parent_of(n) == canonical_dir]
        found += [(n, "segment") for n in self.segments if parent_of(n) == canonical_dir]
        return sorted(found)

    # ------------------------------------------------------------------ namespace
    def mkdir(self, name: str, *, parents: bool = False, exist_ok: bool = False) -> None:
        canonical_name = canonical(name)
        if parents:
            parts = canonical_name.split("/")
            for depth in range(1, len(parts)):
                self.mkdir("/".join(parts[:depth]), exist_ok=True)
        if canonical_name in self.directories:
            if exist_ok:
                return
            raise Expected("exists")
        if canonical_name in self.segments:
            raise Expected("exists")
        self._require_directory(parent_of(canonical_name))
        self.directories.add(canonical_name)

    def create(self, name: str, *, durability: str, make_parents: bool = False) -> None:
        canonical_name = canonical(name)
        if durability not in DURABILITY_LEVELS:
            raise Expected("invalid_argument")
        if make_parents and parent_of(canonical_name):
            self.mkdir(parent_of(canonical_name), parents=True, exist_ok=True)
        if self._taken(canonical_name):
            raise Expected("exists")
        self._require_directory(parent_of(canonical_name))
        self.segments[canonical_name] = ModelSegment(durability)

    def rmdir(self, name: str) -> None:
        canonical_name = canonical(name)
        if canonical_name not in self.directories:
            raise Expected("not_a_directory" if canonical_name in self.segments else "not_found")
        if self._entries_below(canonical_name):
            raise Expected("not_empty")
        self.directories.remove(canonical_name)

    def rewrite(self, name: str) -> None:
        """No directory of a model run sets ``rewrite_replaces``: append-only everywhere."""
        self.segment(name)
        raise Expected("append_only")

    def delete(self, name: str) -> None:
        self.segment(name)
        del self.segments[canonical(name)]

    def rename(self, old: str, new: str) -> None:
        source, target = canonical(old), canonical(new)
        if source == target or target.startswith(source + "/"):
            raise Expected("invalid_argument")
        if not self._taken(source):
            raise Expected("not_found")
        if target in self.directories:  # POSIX rename: an empty directory by a directory
            if source not in self.directories:
                raise Expected("is_a_directory")
            if self._entries_below(target):
                raise Expected("not_empty")
            self.directories.remove(target)
        elif target in self.segments:  # an unsealed segment by a segment
            if source in self.directories:
                raise Expected("not_a_directory")
            if self.segments[target].sealed:
                raise Expected("sealed")
            del self.segments[target]
        self._require_directory(parent_of(target))
        for before in [source, *self._entries_below(source)]:
            after = target + before[len(source):]
            if before in self.directories:
                self.directories.remove(before)
                self.directories.add(after)
            else:
                self.segments[after] = self.segments.pop(before)

    def set_sealed(self, name: str, sealed: bool) -> None:
        self.segment(name).sealed = sealed

    def set_durability(self, name: str, durability: str) -> None:
        seg = self.segment(name)
        if durability not in DURABILITY_LEVELS or seg.data:
            raise Expected("invalid_argument")
        seg.durability = durability

    def concat(self, target: str, sources: list[str]) -> None:
        if not sources:
            raise Expected("invalid_argument")
        dst = self.segment(target)
        srcs = [self.segment(name) for name in sources]
        if len({id(seg) for seg in [dst, *srcs]}) != len(srcs) + 1:
            raise Expected("invalid_argument")
        if dst.sealed:
            raise Expected("sealed")
        if not all(src.sealed for src in srcs):
            raise Expected("invalid_argument")
        for src in srcs:
            base = len(dst.data)
            dst.data += src.data
            dst.append_ends += [base + end for end in src.append_ends]
        dst.confirm(len(dst.data))  # concat flushes the target and the sources first
        for name in sources:
            del self.segments[canonical(name)]

    # ------------------------------------------------------------------ data
    def append(self, name: str, data: bytes, expected_offset: int | None, *, now_s: float = 0.0) -> int:
        seg = self.segment(name)
        if seg.sealed:
            raise Expected("sealed")
        offset = len(seg.data)
        if expected_offset is not None and expected_offset != offset:
            raise Expected("bad_offset")
        if data:
            seg.data += data
            seg.append_ends.append(len(seg.data))
            if seg.durability == "vd":
                seg.vd_acks.append((now_s, len(seg.data)))
            else:  # pd and tier2: acknowledged once fsynced (tier2: and in tier-2)
                seg.confirm(len(seg.data))
        return offset

    def sync_interval_passed(self, acked_before_s: float) -> None:
        """VD appends acknowledged before ``acked_before_s`` must now survive a crash."""
        for seg in self.segments.values():
            synced = [end for acked_s, end in seg.vd_acks if acked_s <= acked_before_s]
            if synced:
                seg.confirm(max(synced))

    def readable_bounds(self, name: str, *, unconfirmed: bool) -> tuple[int, int]:
        """The lowest and highest length a read may stop at (durable length: between
        what must survive and what was appended; unconfirmed: the appended length)."""
        seg = self.segment(name)
        if unconfirmed:
            return len(seg.data), len(seg.data)
        return seg.must_survive_bytes, len(seg.data)

    def sync_all(self) -> None:
        for seg in self.segments.values():
            seg.confirm(len(seg.data))

    # ------------------------------------------------------------------ crashes
    def crashed(self, name: str, surviving_bytes: int) -> str | None:
        """Apply what a restarted store kept of segment ``name`` after kill -9; the
        broken promise, if any (the caller has checked the bytes are our prefix)."""
        seg = self.segments[name]
        if seg.in_flight and surviving_bytes == len(seg.data) + len(seg.in_flight):
            seg.data += seg.in_flight  # it landed, whole
            seg.append_ends.append(len(seg.data))
        seg.in_flight = b""
        if surviving_bytes < seg.must_survive_bytes:
            return (f"{name}: {surviving_bytes} bytes survived kill -9 but "
                    f"{seg.must_survive_bytes} were promised")
        if surviving_bytes > len(seg.data):
            return f"{name}: {surviving_bytes} bytes after a crash, only {len(seg.data)} appended"
        if surviving_bytes and surviving_bytes not in seg.append_ends:
            return f"{name}: a crash cut an append: {surviving_bytes} is no append's end"
        del seg.data[surviving_bytes:]
        seg.vd_acks.clear()
        seg.append_ends = [end for end in seg.append_ends if end <= surviving_bytes]
        seg.must_survive_bytes = surviving_bytes
        return None
