"""The metadata in tier-2 (as Pravega keeps its metadata in tier-2): continuous backup of
the SQLite metadata under ``_metadata/`` (snapshots plus change batches), the seal that
lets a clean restart skip a new snapshot, ``tierfs restore`` of a lost data dir, and
``tierfs metadata export``/``import``.

Invariants:
- A snapshot is one committed state, read on a connection of its own: commits and
  appends never wait for a backup. The newest snapshot plus the changes shipped after
  it trail the metadata by at most one flush interval plus one shipment.
- Every backup object gets a new name and is never overwritten, so a failed upload can
  leave an incomplete newest backup but never damage an older one; a fenced store
  uploads and prunes nothing more.
- A restore only reads tier-2, follows one lineage, applies change batches in order,
  each verified by its CRC32C, and never over a gap; the data dir changes only when the
  restored database is whole on disk, by one rename.

May import: everything below ``ports`` in ``tierfs/engine`` and ``ports`` (not ``read``,
``flush``, ``upkeep``, ``recovery``), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
