"""Tier-2 chunk storage over any fsspec URL, with Pravega PDP-34's verbs (create, write
at an offset, read, merge, delete), and the one table that turns a backend's errors into
tierfs errors and retries the transient ones.

Invariants:
- ``write`` returns only once the bytes are durable in the backend: the journal bytes
  they replace are deleted afterwards.
- A write at an offset lands at exactly that offset, so a retry never duplicates bytes;
  a merge makes a new object and never changes its sources, and no partial object is
  ever visible under its name.
- Retries on the tier-2 path live in ``calls`` and nowhere else.

May import: the shared root modules, ``tierfs.contracts`` and ``tierfs.blocks``.
"""
