"""The ledger of a chaos run: every append a writer sent, every one acknowledged, and
what each fault allowed to happen to them; ``check`` compares it with what the store
holds.

Every record is one line naming its writer and its number (``record_line``), so its
presence is found by content wherever it is: in its segment, or in a ``lost+found``
file. A writer's records are numbered in the order it sends them.

The promise checked for each acknowledged record (docs/RELIABILITY.md):
- it is in its segment exactly once, after the records its writer acknowledged before
  it (never lost, duplicated or reordered), unless a fault the record's durability level
  does not promise to survive happened after it was acknowledged (``forgive``):
  - ``GONE``: the promise allows it to vanish (a VD append younger than the sync
    interval at a power loss; a PD append not yet flushed when the host and its disk
    were lost);
  - ``MOVED``: it may be out of its segment, but then it is in ``lost+found`` (a
    fenced owner's unflushed appends; appends after a damaged journal frame; the
    damaged record itself, there with its one flipped bit).
- no record, acknowledged or not, is ever in its segment twice; one sent and never
  acknowledged may be there once or not at all.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable

GONE = "gone"
MOVED = "moved"


@dataclasses.dataclass
class Record:
    segment: str
    writer: str
    seq: int
    durability: str
    line: bytes
    front_end: str
    sent_s: float = 0.0  # time.monotonic() of its first send
    acked_s: float | None = None  # time.monotonic() of the acknowledgement
    forgiven: str | None = None  # GONE or MOVED, with why
    why: str = ""


def record_line(run: str, writer: str, seq: int, filler: int) -> bytes:
    """One record: unique in the run, with its CRC so a torn or altered one is noticed."""
    body = b"%s %s %08d %s" % (run.encode(), writer.encode(), seq, b"." * filler)
    return b"R %s %08x\n" % (body, zlib.crc32(body))


def parse_lines(data: bytes) -> Iterable[bytes]:
    """The records in ``data``, each from its ``R `` to its newline. A record torn at the
    end of what a lost host had flushed (a flush cuts records at chunk boundaries; the
    rest was lost, as its promise allows) is followed directly by the next record
    appended after the restore: the torn prefix is skipped, the record after it found."""
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            return
        line = data[start:end + 1]
        yield line[max(0, line.rfind(b"R ")):]
        start = end + 1


def _kept_in(line: bytes, lost_found: bytes) -> bool:
    """``line`` is in ``recovery.lost_found`` as it was, or with one bit flipped: the damaged
    record of a journal bit flip is kept as it was found."""
    if line in lost_found:
        return True
    half = len(line) // 2
    for piece, start_in_line in ((line[:half], 0), (line[half:], half)):
        at = lost_found.find(piece)
        while at >= 0:
            begin = at - start_in_line
            candidate = lost_found[begin:begin + len(line)] if begin >= 0 else b""
            if len(candidate) == len(line):
                differing = [a ^ b for a, b in zip(candidate, line, strict=True) if a != b]
                if len(differing) == 1 and differing[0].bit_count() == 1:
                    return True
            at = lost_found.find(piece, at + 1)
    return False


class Ledger:
    def __init__(self, run: str) -> None:
        self.run = run
        self.records: dict[bytes, Record] = {}
        self._lock = threading.Lock()  # writers are threads
        self.missing: set[bytes] = set()  # acknowledged, forgiven, and missing from their segment at a check

    def sent(self, segment: str, writer: str, seq: int, durability: str, front_end: str, filler: int) -> Record:
        record = Record(segment, writer, seq, durability, record_line(self.run, writer, seq, filler), front_end,
                        time.monotonic())
        with self._lock:
            self.records[record.line] = record
        return record

    def acked(self, record: Record) -> None:
        record.acked_s = time.monotonic()

    def forgive(self, how: str, why: str, which: Callable[[Record], bool]) -> int:
        """Records the promise lets ``how`` happen to, by a fault now; how many."""
        count = 0
        with self._lock:
            for record in self.records.values():
                if record.acked_s is not None and record.forgiven is None and which(record):
                    record.forgiven, record.why = how, why
                    count += 1
        return count

    def lost_found_lost(self, why: str) -> int:
        """The data dir holding lost+found is gone: what was moved there is gone too."""
        count = 0
        with self._lock:
            for record in self.records.values():
                if record.forgiven == MOVED:
                    record.forgiven, record.why = GONE, f"{record.why}, then {why}"
                    count += 1
        return count

    def segments(self) -> dict[str, str]:
        """Every segment written to, with its durability (a copy: writers go on)."""
        with self._lock:
            return {r.segment: r.durability for r in self.records.values()}

    def acknowledged(self) -> list[Record]:
        with self._lock:
            return [r for r in self.records.values() if r.acked_s is not None]

    def check(self, segments: dict[str, bytes], lost_found: bytes) -> list[str]:
        """Problems found: every broken promise, one line each (none: the store keeps
        them all)."""
        problems: list[str] = []
        counts: Counter[bytes] = Counter()
        positions: dict[bytes, tuple[str, int]] = {}
        for name, data in segments.items():
            for index, line in enumerate(parse_lines(data)):
                counts[line] += 1
                positions[line] = (name, index)
        for line, count in counts.items():
            record = self.records.get(line)
            if record is not None and count > 1:
                problems.append(f"duplicated {count} times: {record.writer} #{record.seq} in {record.segment}")
        last_index: dict[tuple[str, str], tuple[int, int]] = {}
        for record in sorted(self.acknowledged(), key=lambda r: (r.writer, r.seq)):
            where = positions.get(record.line)
            if where is None:
                if record.forgiven == GONE or (record.forgiven == MOVED and _kept_in(record.line, lost_found)):
                    self.missing.add(record.line)
                    continue
                state = f" (forgiven as {record.forgiven}: {record.why}, yet not in lost+found)" if record.forgiven else ""
                problems.append(f"lost: {record.front_end} {record.durability} append {record.writer} #{record.seq} "
                                f"to {record.segment}, acknowledged{state}")
                continue
            segment, index = where
            if segment != record.segment:
                problems.append(f"{record.writer} #{record.seq} is in {segment}, not {record.segment}")
            key = (record.segment, record.writer)
            previous = last_index.get(key)
            if previous is not None and index < previous[1]:
                problems.append(f"reordered: {record.writer} #{record.seq} before #{previous[0]} in {segment}")
            last_index[key] = (record.seq, index)
        return problems

    def summary(self) -> dict[str, int]:
        acked = self.acknowledged()
        return {
            "sent": len(self.records), "acknowledged": len(acked),
            "forgiven_gone": sum(r.forgiven == GONE for r in acked),
            "forgiven_moved": sum(r.forgiven == MOVED for r in acked),
            # of those forgiven, how many the faults did take: gone, or only in lost+found
            "gone": sum(r.forgiven == GONE and r.line in self.missing for r in acked),
            "in_lost_found": sum(r.forgiven == MOVED and r.line in self.missing for r in acked),
        }
