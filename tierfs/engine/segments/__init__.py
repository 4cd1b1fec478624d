"""Open segments in memory: each one's state (the write-through copy of its row, its
unflushed tail, its writer marks), the namespace table that hands out one state per
segment, the chunk catalogue (the event loop's way into the metadata), and growth
notifications on this host and across hosts.

Invariants:
- ``flushed_length <= durable_length <= appended_length`` for every segment.
- One state per segment: while anything holds a segment's state, every lookup returns
  that same object, so no change lands on a copy.
- A tail's entries are contiguous and ordered; its memory stays within the shared
  budget (evicted entries are re-read from their CRC-checked journal frames).
- An identified append is marked only once its frame is queued.
- A growth announcement is a hint, never data: listeners re-read lengths.

May import: the shared root modules, ``journal``, ``metadata``, ``tier2``,
``ownership``, ``tierfs.contracts`` and ``tierfs.blocks``.
"""
