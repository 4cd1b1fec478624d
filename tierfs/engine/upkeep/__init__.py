"""Upkeep of tier-2: garbage collection of objects whose metadata is gone, the orphan
sweep (objects no metadata references), removals in flight, and defrag (runs of small
adjacent chunks merged into one, Pravega PDP-34).

Invariants:
- Nothing is deleted that any owner of any epoch may still reference: garbage is queued
  by the commit that dropped its reference and collected after the deletion lag; the
  orphan sweep skips objects younger than its grace period, packs in flight and objects
  their owners are removing; a fenced store deletes nothing.
- A reader sees the old chunks or the merged one, never a gap; merged sources become
  garbage only after the swap commits.

May import: everything below ``ports`` in ``tierfs/engine`` and ``ports`` (not ``read``,
``flush``, ``recovery``, ``backup``), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
