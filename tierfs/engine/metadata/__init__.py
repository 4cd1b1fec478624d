"""The metadata store: segment, directory and chunk records in one database, SQLite in
the data dir (the default) or PostgreSQL shared by many daemons; its schema migrations,
its change log (what the next backup ships), whole-store scans, and the replay of
creations the journal kept.

Invariants:
- Every change of more than one row is one transaction; a segment's updates are
  conditional on its revision, so a stale writer fails and changes nothing.
- Namespace changes (a name is free, a directory is empty) run under the namespace lock,
  so their checks still hold at commit, across daemons too.
- Segment ids are never reused: journal frames of a deleted segment can never be taken
  for another segment's bytes.
- Records are converted to and from the engine's typed values (``record_types``) only
  here, once per load or commit.

May import: the shared root modules, ``journal`` (the frame format of replayed
creations), ``tierfs.contracts`` and ``tierfs.blocks``.
"""
