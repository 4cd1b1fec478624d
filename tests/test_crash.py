"""kill -9 a real process during concurrent PD appends, at many points; every
acknowledged append must be there afterwards, whole, once, in order."""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tierfs import open_store
from tierfs.testing.harness import small_config

HERE = Path(__file__).parent
KILL_POINTS = 24
RECORD = re.compile(rb"<(\d+):(\d+):(\d+):(\d+):([0-9a-f]*)>")


def _run_and_kill(data_dir: Path, run_id: int, acks_before_kill: int) -> list[tuple[str, int, int, str]]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "crash_writer.py"), str(data_dir), str(run_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    acked: list[tuple[str, int, int, str]] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    if acks_before_kill < 0:
        # kill while the child is still starting / recovering
        time.sleep(-acks_before_kill / 1000)
    else:
        while len(acked) < acks_before_kill and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(b"ready"):
                continue
            segment, offset, length, digest = line.decode().split()
            acked.append((segment, int(offset), int(length), digest))
    proc.send_signal(signal.SIGKILL)
    # What the buffered reader already holds comes first: communicate() reads the pipe
    # itself and would start mid-line after a readline that read ahead.
    rest = proc.stdout.read()
    _, stderr = proc.communicate(timeout=30)
    # lines already written to the pipe before the kill were acknowledged too
    for line in rest.splitlines():
        if line and not line.startswith(b"ready"):
            segment, offset, length, digest = line.decode().split()
            acked.append((segment, int(offset), int(length), digest))
    assert acks_before_kill < 0 or acked, f"child acknowledged nothing: {stderr.decode()[-2000:]}"
    return acked


async def _verify(data_dir: Path, acked: list[tuple[str, int, int, str]]) -> None:
    async with open_store(small_config(data_dir)) as store:
        contents = {}
        for info in await store.walk_segments():
            contents[info.name] = await store.read(info.name)
        for segment, offset, length, digest in acked:
            data = contents[segment][offset : offset + length]
            assert hashlib.sha256(data).hexdigest() == digest, (
                f"acknowledged append lost or damaged: {segment} @{offset}+{length}"
            )
        for name, data in contents.items():
            # the segment is a clean sequence of whole records, each exactly once
            seen = set()
            position = 0
            for match in RECORD.finditer(data):
                assert match.start() == position, f"{name}: garbage at {position}"
                key = match.group(1, 2, 3)
                assert key not in seen, f"{name}: record {key} duplicated"
                seen.add(key)
                assert int(match.group(4)) == len(match.group(5))
                position = match.end()
            assert position == len(data), f"{name}: torn record at {position}"


async def test_kill_dash_nine_during_concurrent_pd_appends(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    rng = random.Random(42)
    all_acked: list[tuple[str, int, int, str]] = []
    for run_id in range(KILL_POINTS):
        if run_id in (5, 13):
            point = -rng.randint(50, 300)  # during start-up and recovery
        else:
            point = rng.randint(1, 400)
        all_acked += _run_and_kill(data_dir, run_id, point)
        await _verify(data_dir, all_acked)
    assert len(all_acked) > 1000
