"""Offload and retention policies: set on directories, inherited below them.

Keys (whole seconds or bytes, as their names say; given with units or without: ``4h``,
``30d``, ``1GiB``, ``3600``; shown back with units by ``format_policy_value``):

- ``offload_after_s``: offload a chunk once it has been sealed that long (a chunk is
  sealed when a later chunk exists, or when its segment is sealed and fully flushed);
- ``offload_hot_bytes``: while a segment holds more than this many bytes that are not
  offloaded, offload its oldest sealed chunks;
- ``retention_s``: delete whole chunks from the head once sealed that long;
- ``retention_bytes``: delete whole chunks from the head while the segment keeps at
  least this many bytes without them;
- ``rewrite_replaces`` (0 or 1): with 1, opening an existing unsealed segment for
  rewriting (``O_TRUNC``, ``open("w")``, truncating it to 0 on the mount) replaces its
  name with a new empty segment, atomically; no byte of the old segment changes. With
  0 (the default) such a rewrite is refused (EPERM), which is what protects logs.
  For directories whose files tools rewrite whole: build outputs, git work trees,
  editors, Spark's built-in writers.

Invariants:
- Each key is inherited on its own from the nearest directory (or the root) that sets
  it; unset keys do nothing.
- An effective offload threshold at or above the matching retention threshold is
  rejected (the chunk would be deleted before it is offloaded, or at once after).
- The planning functions are pure: they look at chunk facts and a time, never at
  storage, so they are tested without a store.
- A policy is read from and stored into any frozen dataclass with the directory
  record's policy fields (``PolicyRecord``: the engine's ``DirectoryMeta``), so this
  layer does not depend on the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from tierfs.contracts.errors import InvalidArgumentError
from tierfs.contracts.units import format_duration, format_size, parse_size, parse_whole_seconds

POLICY_KEYS = ("offload_after_s", "offload_hot_bytes", "retention_s", "retention_bytes", "rewrite_replaces")
FLAG_KEYS = ("rewrite_replaces",)  # 0 or 1
_UNSET = ("", "none", "unset")
_FLAG_WORDS = {"0": 0, "1": 1, "false": 0, "true": 1, "no": 0, "yes": 1, "off": 0, "on": 1}


class PolicyRecord(Protocol):
    """A frozen dataclass holding a policy: a key's value counts only if its bit
    (``POLICY_KEYS`` order) is set in ``policy_set``, so 0 stays a usable value."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def policy_set(self) -> int: ...

    @property
    def offload_after_s(self) -> int: ...

    @property
    def offload_hot_bytes(self) -> int: ...

    @property
    def retention_s(self) -> int: ...

    @property
    def retention_bytes(self) -> int: ...

    @property
    def rewrite_replaces(self) -> int: ...


R = TypeVar("R", bound=PolicyRecord)


@dataclasses.dataclass(frozen=True)
class Policy:
    offload_after_s: int | None = None
    offload_hot_bytes: int | None = None
    retention_s: int | None = None
    retention_bytes: int | None = None
    rewrite_replaces: int | None = None

    @classmethod
    def from_record(cls, record: PolicyRecord) -> Policy:
        """The keys a directory record sets (bit i of ``policy_set`` = POLICY_KEYS[i])."""
        values = {
            key: int(getattr(record, key))
            for bit, key in enumerate(POLICY_KEYS)
            if record.policy_set & (1 << bit)
        }
        return cls(**values)

    def stored_in(self, record: R) -> R:
        """``record`` holding exactly this policy (unset keys 0, their bits clear)."""
        policy_set = 0
        values: dict[str, int] = {}
        for bit, key in enumerate(POLICY_KEYS):
            value = getattr(self, key)
            values[key] = value or 0
            if value is not None:
                policy_set |= 1 << bit
        return dataclasses.replace(record, policy_set=policy_set, **values)

    def items(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in POLICY_KEYS if getattr(self, key) is not None}

    @property
    def is_empty(self) -> bool:
        return not self.items()

    def over(self, inherited: Policy) -> Policy:
        """This policy's keys, and ``inherited``'s where this one sets none."""
        return Policy(**{**inherited.items(), **self.items()})

    def changed(self, assignments: Mapping[str, int | None]) -> Policy:
        values: dict[str, int | None] = dict(self.items())
        values.update(assignments)
        return Policy(**{k: v for k, v in values.items() if v is not None})

    def check(self, where: str) -> None:
        """Reject an offload threshold at or above its retention threshold."""
        for offload_key, retention_key in (
            ("offload_after_s", "retention_s"), ("offload_hot_bytes", "retention_bytes")
        ):
            offload, retention = getattr(self, offload_key), getattr(self, retention_key)
            if offload is not None and retention is not None and offload >= retention:
                raise InvalidArgumentError(
                    f"policy of {where or '/'}: {offload_key}={format_policy_value(offload_key, offload)} "
                    f"is at or above {retention_key}={format_policy_value(retention_key, retention)}; chunks would be deleted before they "
                    f"are offloaded (set {offload_key} below {retention_key})"
                )


def parse_assignments(items: Iterable[str]) -> dict[str, int | None]:
    """``["offload_after_s=3600", "retention_bytes=none"]`` -> values (None unsets)."""
    result: dict[str, int | None] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in POLICY_KEYS:
            raise InvalidArgumentError(
                f"policy setting {item!r}: use KEY=VALUE with KEY one of {', '.join(POLICY_KEYS)}"
            )
        raw = raw.strip()
        if raw.lower() in _UNSET:
            result[key] = None
            continue
        result[key] = parse_policy_value(key, raw)
    return result


def parse_policy_value(key: str, raw: object) -> int:
    """One policy value as given (``4h``, ``1GiB``, ``3600``, ``yes``), as the int kept."""
    setting = f"policy setting {key}"
    if key in FLAG_KEYS:
        value = _FLAG_WORDS.get(str(raw).strip().lower()) if not isinstance(raw, int) else raw
        if value not in (0, 1):
            raise InvalidArgumentError(f"{setting}: must be 0 or 1 (or yes/no), not {raw!r}")
        return int(value)
    if key.endswith("_bytes"):
        return parse_size(raw, setting)
    return parse_whole_seconds(raw, setting)


def format_policy_value(key: str, value: int) -> str:
    """How a value is shown to people: ``1GiB``, ``4h``, flags as 0/1."""
    if key in FLAG_KEYS:
        return str(value)
    return format_size(value) if key.endswith("_bytes") else format_duration(value)
