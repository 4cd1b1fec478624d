"""Recovery: rebuild the unflushed tails from the journal after a restart or crash.

Steps, in order:
1. delete journal files wholly below the checkpoint recorded in metadata (a crash
   between recording the checkpoint and unlinking leaves them behind);
2. scan the remaining files in LSN order, stopping at the first torn frame (short,
   bad CRC, broken sequence) and cutting the journal there; damage that intact frames
   follow is corruption, not a tear (``journal.scan``): recovery stops with
   ``JournalDamagedError``, or, repairing (``fsck --repair``, ``recovery.journal_repair``),
   moves the damage to lost+found and scans again;
3. for each valid create frame at or above the checkpoint: put the segment back if the
   metadata lost its unsynced creation (``recreate``, ``metadata.replay``), so the appends
   that follow find it (below the checkpoint a creation is durable: its unsynced commit
   came before its frame, and the checkpoint's synced commit after it); for each valid append: skip it if its segment was deleted, skip the part already
   flushed to tier-2 (offset below the flushed length) or already replayed
   (duplicates), and append the rest to the segment's tail; a gap is corruption (when
   repairing, the frames after it go to lost+found);
4. fdatasync the surviving files, so everything replayed is durable before any reader
   can see it (the replayed bytes become the new durable length).

Memory: the scan reads the files in pieces; replayed bytes are kept in memory while the
shared tail budget has room, and past it left in their journal frames, consecutive
frames of one segment in one file sharing one tail entry (up to
``MERGED_ENTRY_MAX_BYTES``), so recovering any amount of journal holds about the budget
plus one small object per MiB, not the journal nor an object per append.

Bytes a chunk object holds beyond its committed length (a write that completed just
before a crash, with no metadata commit) are never read: reads stop at the committed
length, and the new epoch writes new chunks rather than appending to old ones.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable
from pathlib import Path

from tierfs.contracts.errors import JournalCorruptionError
from tierfs.contracts.reports.statistics import RecoveryReport
from tierfs.engine.durable_files import fsync_directory
from tierfs.engine.journal.frames import ReplayedCreate, ScanResult, list_files
from tierfs.engine.journal.scan import JournalDamagedError, ReplayedFrame, scan
from tierfs.engine.recovery.journal_repair import JournalRepair
from tierfs.engine.segments.state import SegmentState
from tierfs.engine.segments.tail import TailBudget, TailEntry

log = logging.getLogger(__name__)



def recover_journal(
    journal_dir: Path,
    checkpoint_lsn: int,
    segment_by_id: Callable[[int], SegmentState | None],
    recreate: Callable[[ReplayedCreate], bool],
    budget: TailBudget,
    max_payload_bytes: int,
    *,
    now_s: float,
    repair: JournalRepair | None = None,
) -> tuple[RecoveryReport, list[SegmentState]]:
    """Blocking: run the steps above, filling the segments' tails; returns the report
    and the segments that got replayed bytes (the caller must hold them: their tails
    live nowhere else). ``repair``: move damage to lost+found instead of refusing.

    Replayed appends are stamped ``now_s``: a ``clock.monotonic_s()`` reading the caller
    takes on the event loop, since this runs in a worker thread, which cannot read the
    trio clock."""
    files = []
    for start, path in list_files(journal_dir):
        if path.stat().st_size == 0:
            path.unlink()  # holds nothing; its name would collide with the next file
        else:
            files.append((start, path))
    keep: list[tuple[int, Path]] = []
    for index, (start, path) in enumerate(files):
        end = files[index + 1][0] if index + 1 < len(files) else None
        if end is not None and end <= checkpoint_lsn:
            path.unlink()
        else:
            keep.append((start, path))
    frames = skipped = replayed_bytes = recreated = 0
    replayed: dict[int, SegmentState] = {}  # held here: a lookup's state may be let go
    file_starts = [start for start, _ in keep]
    while True:
        result = ScanResult(end_lsn=keep[0][0] if keep else checkpoint_lsn, next_seq=1)
        try:
            for frame in scan(keep, max_payload_bytes, result):
                counts = _replay(frame, keep, file_starts, replayed, segment_by_id, recreate, budget, now_s, repair,
                                 checkpoint_lsn)
                frames, skipped, replayed_bytes, recreated = (
                    frames + counts[0], skipped + counts[1], replayed_bytes + counts[2], recreated + counts[3])
        except JournalDamagedError as damaged:
            if repair is None:
                raise
            repair.take_out_stretch(damaged.stretch)
            continue  # again from the start: what was replayed already is skipped as a duplicate
        break
    torn = 0
    if result.cut is not None:
        path, position = result.cut
        torn = path.stat().st_size - position
        log.warning("journal %s: cutting %d torn bytes at offset %d%s", path.name, torn, position,
                    f" ({result.unsynced_frames_dropped} whole frames after the tear were never synced)"
                    if result.unsynced_frames_dropped else "")
        if position == 0:
            path.unlink()  # an empty file would collide with the next file's name
            keep = [(s, p) for s, p in keep if p != path]
        else:
            with open(path, "r+b") as f:
                f.truncate(position)
                os.fsync(f.fileno())
    for path in result.dropped_files:
        log.warning("journal %s: dropped, it follows a torn frame", path.name)
        path.unlink()
    for _, path in keep:
        if path.exists():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    journal_dir.mkdir(parents=True, exist_ok=True)
    fsync_directory(journal_dir)
    for seg in replayed.values():
        seg.durable_length = seg.appended_length
    return RecoveryReport(
        files_replayed=len(keep) - len(result.dropped_files),
        frames_replayed=frames,
        bytes_replayed=replayed_bytes,
        frames_skipped=skipped,
        torn_bytes_cut=torn,
        files_dropped=len(result.dropped_files),
        end_lsn=result.end_lsn,
        next_seq=result.next_seq,
        segments_recreated=recreated,
        unsynced_frames_dropped=result.unsynced_frames_dropped,
        damaged_stretches_moved=repair.stretches if repair else 0,
        frames_moved=repair.frames_moved if repair else 0,
    ), list(replayed.values())


def _replay(
    frame: ReplayedFrame,
    keep: list[tuple[int, Path]],
    file_starts: list[int],
    replayed: dict[int, SegmentState],
    segment_by_id: Callable[[int], SegmentState | None],
    recreate: Callable[[ReplayedCreate], bool],
    budget: TailBudget,
    now_s: float,
    repair: JournalRepair | None,
    checkpoint_lsn: int,
) -> tuple[int, int, int, int]:
    """Replay one frame; (frames replayed, skipped, bytes replayed, segments recreated)."""
    if isinstance(frame, ReplayedCreate):
        # below the checkpoint the metadata holds it for sure: a reopen after many creates
        # then costs no transaction per creation
        return 0, 0, 0, int(frame.frame_lsn >= checkpoint_lsn and recreate(frame))
    seg = replayed.get(frame.segment_id)
    if seg is None:
        seg = segment_by_id(frame.segment_id)
    frame_end = frame.offset + len(frame.data)
    if seg is not None and frame.writer and frame.offset <= seg.appended_length:
        # the append is in the segment: a retry of it must be found after the restart too
        seg.writer_marks.record(frame.writer, frame.writer_seq, frame.offset, len(frame.data), 0)
    if seg is None or frame_end <= seg.appended_length:
        return 0, 1, 0, 0  # deleted segment, flushed bytes, or a duplicate
    if frame.offset > seg.appended_length:
        if repair is None:
            raise JournalCorruptionError(
                f"journal is missing bytes {seg.appended_length}..{frame.offset} of "
                f"segment {seg.name!r} (frame seq {frame.seq}); run tierfs fsck --repair"
            )
        index = bisect.bisect_right(file_starts, frame.frame_lsn) - 1
        repair.take_out_frame(frame, keep[index][1], keep[index][0], seg.name, seg.appended_length)
        return 0, 1, 0, 0
    cut = seg.appended_length - frame.offset
    data = frame.data[cut:] if cut else frame.data
    replayed[seg.segment_id] = seg
    # The frame is in its journal file already: past the tail budget its bytes are
    # left there (read back when flushed), and consecutive such frames of a segment
    # share one entry, so recovery holds about the budget whatever the journal holds.
    in_memory = len(data) <= budget.keep_max_bytes and budget.used_bytes + len(data) <= budget.limit_bytes
    last = seg.tail.last()
    same_file = last is not None and (bisect.bisect_right(file_starts, last.frame_lsn)
                                      == bisect.bisect_right(file_starts, frame.frame_lsn))
    if in_memory or cut or not same_file or not seg.tail.merge_evicted(
            frame.frame_lsn, frame.end_lsn, len(data), frame.wall_ns):
        entry = TailEntry(
            offset=seg.appended_length,
            length=len(data),
            frame_lsn=frame.frame_lsn,
            frame_skip=cut,
            end_lsn=frame.end_lsn,
            appended_s=now_s,
            wall_ns=frame.wall_ns,
            data=data if in_memory else None,
        )
        seg.tail.add(entry)
        if in_memory:
            budget.hold(entry)
    seg.appended_length += len(data)
    seg.last_append_s = now_s
    return 1, 0, len(data), 0


