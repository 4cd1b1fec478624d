"""Putting back a segment creation that the journal kept and the metadata lost.

A create on SQLite commits without an fsync (``create_segment(synced=False)``) and
writes a creation frame to the journal (``journal.frames.encode_create``), which syncs
it with the appends that follow; if the host goes down before the metadata's WAL
reached the disk, recovery finds the frame and calls ``recreate_from_journal``.

Invariants:
- SQLite's WAL survives as a prefix of its commits, and segment ids only grow
  (AUTOINCREMENT): a creation was lost exactly when every id the metadata ever handed
  out is below it. A missing row with a lower id was deleted by a later (synced)
  commit and stays deleted.
- One transaction: the row with its original id and record, and the parent's times as
  the creation moved them.
"""

from __future__ import annotations

import dataclasses

from tierfs.contracts import names
from tierfs.contracts.errors import JournalCorruptionError, SegmentExistsError, SegmentNotFoundError
from tierfs.engine import records
from tierfs.engine.journal.frames import ReplayedCreate
from tierfs.engine.metadata.database import SQLITE
from tierfs.engine.metadata.store import MetadataStore
from tierfs.engine.record_types import DirectoryMeta, SegmentMeta


def recreate_from_journal(metadata: MetadataStore, frame: ReplayedCreate) -> bool:
    """``recreate_segment`` of a create frame recovery found; a frame the metadata
    cannot take back (its parent gone, its name taken: not a state a crash leaves,
    e.g. metadata restored from elsewhere under this journal) stops the open."""
    if metadata.database.dialect != SQLITE:
        raise JournalCorruptionError(
            f"the journal holds the creation of {frame.name!r}, which only a store with SQLite "
            "metadata writes; this store's metadata is elsewhere")
    try:
        return recreate_segment(metadata, frame.segment_id, frame.name, records.load(SegmentMeta, frame.record))
    except (SegmentExistsError, SegmentNotFoundError) as e:
        raise JournalCorruptionError(
            f"the journal's creation of {frame.name!r} (segment {frame.segment_id}, seq {frame.seq}) "
            f"does not fit the metadata: {e}; run tierfs fsck") from None


def recreate_segment(metadata: MetadataStore, segment_id: int, name: str, record: SegmentMeta) -> bool:
    """Insert the segment the journal's creation frame describes, unless the
    metadata already handed out its id; True if it was inserted."""
    db = metadata.database
    with db.transaction(namespace=True):
        highest = db.execute("SELECT seq FROM sqlite_sequence WHERE name='segments'").fetchone()
        if highest is not None and int(highest[0]) >= segment_id:
            return False
        parent = names.parent_of(name)
        if parent:
            found = db.execute("SELECT value FROM directories WHERE name=?", (parent,)).fetchone()
            if found is None:
                raise SegmentNotFoundError(parent)
            directory = records.load(DirectoryMeta, bytes(found[0]))
        else:
            directory = metadata.load_root_directory()
        if metadata.name_taken(name):
            raise SegmentExistsError(name)
        db.execute("INSERT INTO segments (id, name, rev, value) VALUES (?, ?, 1, ?)",
                   (segment_id, name, records.dump(record)))
        stamp = record.created_ns
        metadata.write_directories({parent: dataclasses.replace(
            directory, modified_ns=max(directory.modified_ns, stamp),
            changed_ns=max(directory.changed_ns, stamp))})
    return True
