"""The read path: (segment, offset range) to bytes, from the unflushed tail and from
chunk blocks fetched as ranged reads into a shared cache of verified 1 MiB blocks, with
per-handle sequential detection and read-ahead.

Invariants:
- Ordinary reads stop at the durable length (LAC): a reader never sees bytes a crash
  can take away. Only ``unconfirmed`` reads go up to the appended length.
- Every byte returned was verified: chunk blocks against their CRC32C before they enter
  the cache, journal frames against their frame CRC.
- The tail and the flushed length are captured in one synchronous step, so a flush
  meanwhile never makes a byte vanish or appear twice.
- The cache is bounded by bytes; concurrent misses on one block make one fetch.

May import: everything below ``ports`` in ``tierfs/engine`` (not ``flush``, ``upkeep``,
``recovery``, ``backup``), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
