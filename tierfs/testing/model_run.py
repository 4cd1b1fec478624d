"""A seeded random run of operations on a real store and on the reference model
(``testing/model.py``) side by side, with restarts and kill -9 in between; it stops at
the first divergence. The operations are in ``testing/model_ops.py``.

Hosts: ``InProcessHost`` (``open_store``; clean restarts only) and ``DaemonHost`` (a real
``tierfs serve`` through ``RemoteStore``; clean restarts, kill -9 between operations and
kill -9 while an append is on its way).

Invariants:
- The same seed gives the same operations as long as the store gives the same answers
  (durable lengths only steer what is checked; a seal racing appends or a kill during
  one may change what comes next, and the failure message lists what came before).
- After every restart the whole namespace, every segment's bytes, sealed flag and
  durability are compared, and fsck must find nothing; after a kill -9 the model first
  takes in what the kill was allowed to take (``ReferenceModel.crashed``).
- ``python -m tierfs.testing.model_run DIR --seed N`` replays a run; it exits 1 with the
  divergence.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import trio

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.contracts.reports.info import SegmentInfo
from tierfs.testing.harness import Daemon, small_config, start_daemon
from tierfs.testing.model_ops import (
    KILLS,
    Divergence,
    ModelRun,
    RunStats,
)

# a VD append is promised to survive kill -9 once this long after its acknowledgement:
# DaemonHost's vd_sync_interval_s plus a generous fsync allowance for a loaded machine
VD_PROMISE_AFTER_S = 0.2 + 2.0
MAX_KILL_DELAY_S = 0.03  # a kill while an append is queued, written, syncing or answered


class StoreHost(Protocol):
    supports_kill: bool
    names_exact: bool  # every odd name reaches the engine as given

    def kill_now(self) -> None:
        """SIGKILL the store's process now (only where ``supports_kill``)."""
        ...

    def session(self, *, kill_at_end: Callable[[], bool]) -> Any:
        """Async context manager: an open store; on exit closed cleanly, or killed with
        SIGKILL when ``kill_at_end()`` says so."""
        ...


class InProcessHost:
    supports_kill = False
    names_exact = True

    def __init__(self, data_dir: Path) -> None:
        self.config = small_config(data_dir, max_backlog_bytes=64 << 20)

    def kill_now(self) -> None:
        raise NotImplementedError("an in-process store cannot be killed apart from its caller")

    @asynccontextmanager
    async def session(self, *, kill_at_end: Callable[[], bool]) -> AsyncIterator[SegmentStoreAPI]:
        from tierfs.store.facade import open_store

        async with open_store(self.config) as store:
            yield store


class DaemonHost:
    supports_kill = True
    names_exact = True  # the client sends names as typed (remote/client.py)
    CONFIG = (  # small thresholds: flushes, chunk and journal rollover, VD syncs happen
        "flush_interval_s = 0.05\nflush_bytes = 65536\nmax_chunk_bytes = 262144\n"
        "max_flush_bytes = 131072\njournal_file_bytes = 131072\nvd_sync_interval_s = 0.2\n"
    )

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file = data_dir.parent / f"{data_dir.name}.toml"
        self.config_file.write_text(self.CONFIG)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.daemon: Daemon | None = None

    def kill_now(self) -> None:
        assert self.daemon is not None
        self.daemon.kill9()

    @asynccontextmanager
    async def session(self, *, kill_at_end: Callable[[], bool]) -> AsyncIterator[SegmentStoreAPI]:
        from tierfs.remote.remote_store import RemoteStore

        daemon = await trio.to_thread.run_sync(lambda: start_daemon(
            self.data_dir, config_file=self.config_file, drop_tierfs_env=True, verbose=False))
        self.daemon = daemon
        client = daemon.client()
        try:
            yield RemoteStore(client)
        finally:
            client.close()
            if kill_at_end():
                await trio.to_thread.run_sync(daemon.kill9)
            else:
                code, stderr = await trio.to_thread.run_sync(daemon.stop)
                if code != 0:
                    raise Divergence(f"the daemon exited with {code} on SIGTERM: {stderr[-2000:]}")


async def after_crash(run: ModelRun, store: SegmentStoreAPI) -> None:
    """Apply what survived kill -9 to the model; raise if a promise was broken."""
    for name, seg in sorted(run.model.segments.items()):
        info = await store.stat(name)
        assert isinstance(info, SegmentInfo)
        kept = await store.read(name, 0, None, unconfirmed=True)
        if kept != (bytes(seg.data) + seg.in_flight)[: len(kept)]:
            raise run.fail(f"after kill -9, {name!r} is not a prefix of what was appended")
        before = len(seg.data) + len(seg.in_flight)
        broken = run.model.crashed(name, len(kept))
        if broken:
            raise run.fail(f"after kill -9: {broken}")
        run.stats.vd_bytes_lost_to_kills += before - len(kept)


async def kill_mid_append(run: ModelRun, store: SegmentStoreAPI, host: StoreHost) -> None:
    """kill -9 the daemon while an append to a live segment is on its way."""
    live = [name for name, seg in sorted(run.model.segments.items()) if not seg.sealed]
    if not live:
        await trio.to_thread.run_sync(host.kill_now)
        return
    name, data = run.rng.choice(live), run.payload() or b"x"
    delay_s = run.rng.uniform(0, MAX_KILL_DELAY_S)
    run.history.append(f"append {name!r} {len(data)} bytes, kill -9 after {delay_s * 1000:.0f} ms")
    answers: list[int] = []

    async def append() -> None:
        with contextlib.suppress(Exception):  # the daemon died under it: no answer
            answers.append(await store.append(name, data))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(append)
        await trio.sleep(delay_s)
        await trio.to_thread.run_sync(host.kill_now)
    if answers:
        offset = run.model.append(name, data, None, now_s=time.monotonic())
        if answers[0] != offset:
            raise run.fail(f"append returned offset {answers[0]}, the model {offset}")
    else:
        run.model.segments[name].in_flight = data


async def run_model(host: StoreHost, seed: int, operations: int) -> RunStats:
    """``operations`` random operations of ``seed`` on ``host``'s store and the model."""
    stats = RunStats()
    run = ModelRun(seed, stats, names_exact=host.names_exact)
    while True:
        async with host.session(kill_at_end=lambda: run.killed) as store:
            if run.killed:
                await after_crash(run, store)
            await run.check_everything(store)
            run.killed = False
            while stats.operations < operations:
                operation = run.pick(host.supports_kill)
                stats.operations += 1
                if operation == "restart":
                    stats.restarts += 1
                    stats.by_operation[operation] += 1
                    break
                if operation in KILLS:
                    run.model.sync_interval_passed(time.monotonic() - VD_PROMISE_AFTER_S)
                    stats.kills += 1
                    stats.by_operation[operation] += 1
                    run.killed = True
                    if operation == "kill_mid_append":
                        await kill_mid_append(run, store, host)
                    break
                await run.step(store, operation)
            else:
                return stats
        run.history.append("kill -9" if run.killed else "restart")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tierfs.testing.model_run",
                                     description="random operations on a store and the reference model")
    parser.add_argument("data_dir", type=Path, help="an empty directory (created)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--operations", type=int, default=2000)
    parser.add_argument("--daemon", action="store_true", help="a real daemon, with kill -9")
    args = parser.parse_args(argv)
    if args.data_dir.exists() and any(args.data_dir.iterdir()):
        parser.error(f"{args.data_dir} is not empty (the model starts from nothing)")
    host: StoreHost = DaemonHost(args.data_dir) if args.daemon else InProcessHost(args.data_dir)
    started = time.monotonic()
    try:
        stats = trio.run(run_model, host, args.seed, args.operations)
    except Divergence as divergence:
        print(f"DIVERGENCE: {divergence}", file=sys.stderr)
        sys.exit(1)
    print(f"{stats} in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
