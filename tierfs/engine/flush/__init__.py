"""Flushing: the storage writer moves durable journal bytes into tier-2 chunks in the
background, planned per segment (a chunk grows until ``chunk_bytes``) or in batches of
small segments packed into one object.

Invariants:
- Only durable (LAC) bytes are flushed, and nothing is committed unless its bytes are
  in tier-2 and a claim check started after they got there found this store the owner.
- A commit is all or nothing: flushed length and chunk record move together.
- A tier-2 failure never blocks appends: the segment retries with backoff until the
  backlog bound refuses new appends.
- Journal files are deleted only once every byte in them is committed in tier-2.

May import: everything below ``ports`` in ``tierfs/engine`` and ``ports`` (not ``read``,
``upkeep``, ``recovery``, ``backup``), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
