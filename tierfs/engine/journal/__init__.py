"""Tier-1, the journal: appends and creations as CRC-framed records in rolling local
files named by LSN, made durable by group commit (one fdatasync round in flight at a
time, through Linux native AIO or a sync thread).

Invariants:
- Frames are written in LSN order by one writer, so a journal file is a prefix of
  valid frames followed at most by one torn frame.
- ``durable_lsn`` advances only after an fdatasync covering every byte below it (and of
  the directory for files created since): nothing is reported durable that a crash can
  take away.
- A scan never takes corruption for a torn tail: bytes once synced whole are reported
  damaged, never cut.
- Disk space for a frame is reserved before the frame is accepted; a refusal changes
  nothing.

May import: the engine's shared root modules (``clock``, ``durable_files``,
``space_reserve``), ``tierfs.contracts`` and ``tierfs.blocks``; nothing else of the
engine.
"""
