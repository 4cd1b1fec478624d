"""The example data pipeline on embedded defaults (``./dev.sh demo``): it starts, in
order, the programs a deployment runs side by side (each in ``examples/events/``, each a
template to copy), then checks what they did.

1. A local S3 server (moto, on 127.0.0.1) plays the long-term store, and ``tierfs mount``
   runs the daemon with its FUSE mount, offloading to it.
2. The streaming job (``event_counts.py``) follows ``tierfs://events/``: events per
   window of event time and kind, into ``tierfs://results/event_counts``.
3. Three producers append JSON events for 15 s, each the way the README teaches:
   ``produce.py`` through fsspec (``tierfs://events/web``), ``produce_to_file.sh`` as a
   service writing its log on the mount (``<mount>/events/mobile``), and
   ``produce_with_cli.sh`` with ``tierfs append`` (``events/batch``).
4. Once the stream wrote every window the watermark closed, it is stopped; the event
   segments are sealed and offloaded with ``tierfs seal`` and ``tierfs offload`` (their
   local copies deleted); the batch job (``history.py``) counts the whole history again,
   its executors reading the S3 objects themselves.
5. The check: the history holds every event the producers said they sent, and the
   stream's windows equal the history's (exit 1 on any difference).

Without ``/dev/fuse`` the daemon serves without a mount and the log producer writes
through fsspec instead.

    .venv/bin/python examples/pipeline.py [WORK_DIR]     (default: ./pipeline-data)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import boto3
import fsspec

EVENTS = Path(__file__).resolve().parent / "events"
PRODUCE_S = 15
WINDOW_S, WATERMARK_S = 3, 6  # short, so a 15 s run closes a few windows
STREAM_WAIT_S = 300  # a failure bound only: the wait ends as soon as the windows are in
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "pipeline", "AWS_SECRET_ACCESS_KEY": "pipeline",
                  "AWS_DEFAULT_REGION": "us-east-1"}
SEGMENTS = ("events/web", "events/mobile", "events/batch")


def say(text: str) -> None:
    print(f"[pipeline] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit("the local S3 server (moto) did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def unmount(mountpoint: Path) -> None:
    done = subprocess.run(["tierfs", "umount", str(mountpoint)], capture_output=True, text=True)
    if done.returncode != 0:  # say so: the mount is still there
        print(done.stderr, end="", file=sys.stderr, flush=True)


def tierfs(*args: str) -> str:
    """The tierfs command, as typed in a shell; its output, or exit with its error."""
    done = subprocess.run(["tierfs", *args], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"tierfs {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def window_end_s(window: str) -> float:
    start = datetime.strptime(window, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return start.timestamp() + WINDOW_S


def read_rows(url: str) -> dict[tuple[str, str], tuple[int, float]]:
    """A results segment: (window, kind) -> (events, amount); a row twice is a failure."""
    fs = fsspec.filesystem("tierfs")
    if not fs.exists(url):
        return {}
    rows = [json.loads(line) for line in fs.cat_file(url).splitlines()]
    found = {(row["window"], row["kind"]): (row["events"], row["amount"]) for row in rows}
    if len(found) != len(rows):
        raise SystemExit(f"a window was written twice in {url}")
    return found


def latest_event_s() -> float:
    fs = fsspec.filesystem("tierfs")
    return max(json.loads(line)["ts"] for name in SEGMENTS for line in fs.cat_file(name).splitlines())


def wait_for_closed_windows(stream_job: subprocess.Popen[str]) -> dict[tuple[str, str], tuple[int, float]]:
    """Until the stream wrote each window the watermark has closed (end <= the latest
    event time - WATERMARK_S): those are all it can write until more events arrive."""
    watermark_s = latest_event_s() - WATERMARK_S
    waited_s = 0.0
    while True:
        results = read_rows("tierfs://results/event_counts")
        written = {window for window, _ in results}
        if written and max(window_end_s(w) for w in written) + WINDOW_S > watermark_s:
            return results  # the last window the watermark closed is in (windows close in order)
        if stream_job.poll() is not None:
            raise SystemExit("the streaming job ended before writing the closed windows")
        if waited_s > STREAM_WAIT_S:
            raise SystemExit(f"the streaming job wrote no window ending before {watermark_s:.0f} in "
                             f"{STREAM_WAIT_S} s")
        time.sleep(0.5)
        waited_s += 0.5


def main(work: Path) -> int:
    shutil.rmtree(work, ignore_errors=True)
    data_dir, mountpoint, checkpoint = work / "store", work / "mnt", work / "checkpoint"
    mountpoint.mkdir(parents=True)
    # what every program below reads: the data dir, the tierfs command, S3's credentials
    os.environ.update(S3_CREDENTIALS, TIERFS_DATA_DIR=str(data_dir))
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    with local_s3() as endpoint, contextlib.ExitStack() as cleanup:  # every exit stops what it started
        bucket = "tierfs-pipeline"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        offload = ["--offload-to", f"s3://{bucket}/longterm", "--offload-endpoint-url", endpoint,
                   "--deletion-lag", "0"]
        mounted = Path("/dev/fuse").exists() and subprocess.run(
            ["tierfs", *offload, "mount", str(mountpoint)], capture_output=True).returncode == 0
        if mounted:
            cleanup.callback(unmount, mountpoint)
        else:
            say("no FUSE here: serving without a mount; the log producer writes through fsspec")
            server = subprocess.Popen(["tierfs", *offload, "serve"])
            cleanup.callback(stop_process, server)
            while not (data_dir / "tierfs.sock").exists():  # its API socket: it serves
                if server.poll() is not None:
                    raise SystemExit("tierfs serve did not start (its error is above)")
                time.sleep(0.1)
        say(f"tierfs at {data_dir}" + (f", mounted at {mountpoint}" if mounted else "") +
            f"; long-term store s3://{bucket} on {endpoint}")
        tierfs("mkdir", "-p", "events")
        for name in SEGMENTS:  # all exist before the stream starts
            tierfs("create", name)

        stream_job = subprocess.Popen(
            [sys.executable, str(EVENTS / "event_counts.py"), str(checkpoint), "--window", f"{WINDOW_S} seconds",
             "--watermark", f"{WATERMARK_S} seconds"], stdout=subprocess.PIPE, text=True)
        cleanup.callback(stop_process, stream_job)
        assert stream_job.stdout is not None
        started = stream_job.stdout.readline()  # its first line, once the query runs
        if not started.startswith("[event_counts] streaming"):
            raise SystemExit("the streaming job did not start (its error is above)")
        print(started, end="", flush=True)
        log_producer = ([str(EVENTS / "produce_to_file.sh"), str(mountpoint / "events" / "mobile"), str(PRODUCE_S)]
                        if mounted else
                        [sys.executable, str(EVENTS / "produce.py"), "tierfs://events/mobile", "--seconds",
                         str(PRODUCE_S)])
        producers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for command in (
            [sys.executable, str(EVENTS / "produce.py"), "tierfs://events/web", "--seconds", str(PRODUCE_S)],
            log_producer,
            [str(EVENTS / "produce_with_cli.sh"), "events/batch", str(PRODUCE_S)])]
        for producer in producers:
            cleanup.callback(stop_process, producer)
        sent = 0
        for producer in producers:
            out, _ = producer.communicate()
            if producer.returncode != 0 or not (said := re.search(r"sent (\d+) events to (\S+)", out)):
                raise SystemExit(f"a producer failed: {producer.args}")
            say(said.group(0))
            sent += int(said.group(1))

        streamed = wait_for_closed_windows(stream_job)
        stop_process(stream_job)
        print(stream_job.stdout.read(), end="", flush=True)
        say(f"the streaming job wrote {len(streamed)} closed (window, kind) rows:")
        for (window, kind), (events, amount) in sorted(streamed.items()):
            print(f"    {window}  {kind:5}  {events:5} events  {amount:9.2f}")

        for name in SEGMENTS:
            tierfs("seal", name)
            tierfs("offload", "--quiet", name)
        say(f"sealed and offloaded {', '.join(SEGMENTS)} to s3://{bucket}/longterm (local copies deleted)")
        metrics_url = ["curl", "-s", "--unix-socket", str(data_dir / "tierfs.sock"), "http://tierfs/metrics"]
        gets_before = _tier2_gets(subprocess.run(metrics_url, capture_output=True, text=True, check=True).stdout)
        subprocess.run([sys.executable, str(EVENTS / "history.py"), "--window", f"{WINDOW_S} seconds",
                        "--s3-endpoint", endpoint], check=True, timeout=600)
        daemon_gets = _tier2_gets(subprocess.run(metrics_url, capture_output=True, text=True, check=True).stdout)
        say(f"the batch job's executors read S3 themselves (the daemon fetched {daemon_gets - gets_before:.0f} "
            "blocks)")
        return check(sent, streamed, read_rows("tierfs://results/history"))


def _tier2_gets(metrics: str) -> float:
    found = re.search(r"^tierfs_tier2_gets_total (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def check(sent: int, streamed: dict[tuple[str, str], tuple[int, float]],
          history: dict[tuple[str, str], tuple[int, float]]) -> int:
    in_history = sum(events for events, _ in history.values())
    if in_history != sent:
        say(f"MISMATCH: the producers sent {sent} events, the history holds {in_history}")
        return 1
    differ = {key: (value, history.get(key)) for key, value in streamed.items() if history.get(key) != value}
    if not streamed or differ:
        say(f"MISMATCH between the stream's windows and the history's: {differ or 'no window streamed'}")
        return 1
    say(f"OK: the history holds all {sent} events sent, and the stream's {len(streamed)} closed windows "
        "match it")
    return 0


if __name__ == "__main__":
    # stopped by a service manager or `kill`: unwind, so what it started is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "pipeline-data"))
