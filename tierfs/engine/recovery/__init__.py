"""After a restart or crash: the journal's valid frames are replayed into the segments'
unflushed tails; a damaged journal is repaired (``tierfs fsck --repair``); acknowledged
bytes that cannot go where they belong are held in lost+found and can be appended again.

Invariants:
- Every acknowledged byte is in a tail, in tier-2, or in lost+found after recovery:
  recovery never drops a frame it cannot place.
- Only a torn tail (never synced, never acknowledged) is cut; damage in synced bytes
  stops recovery with the file and offset named.
- Replay skips what tier-2 already holds (below a segment's flushed length), appends of
  deleted segments and duplicates; everything replayed is durable before any reader
  can see it.

May import: everything below ``ports`` in ``tierfs/engine`` and ``ports`` (not ``read``,
``flush``, ``upkeep``, ``backup``), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
