"""Random operations on a real store checked against the reference model
(tierfs/testing/model.py, model_run.py): in-process, and through a real daemon with
kill -9; a store that loses an append must be caught."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tierfs.contracts.api import SegmentStoreAPI
from tierfs.testing.model_ops import Divergence
from tierfs.testing.model_run import DaemonHost, InProcessHost, run_model


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_in_process_store_matches_the_model(tmp_path: Path, seed: int) -> None:
    stats = await run_model(InProcessHost(tmp_path / "data"), seed=seed, operations=5000)
    assert stats.restarts >= 3 and stats.by_operation["append"] > 1000
    assert sum(stats.errors_matched.values()) > 500  # the error paths were compared too


async def test_daemon_matches_the_model_across_kill_dash_nine(tmp_path: Path) -> None:
    stats = await run_model(DaemonHost(tmp_path / "data"), seed=2, operations=1500)
    assert stats.kills >= 2 and stats.by_operation["append"] > 400  # about 9 and 600


class LosingStore:
    """Wraps a store; every 40th non-empty append is acknowledged but not made."""

    def __init__(self, store: SegmentStoreAPI) -> None:
        self._store = store
        self._appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, name: str, data: bytes, *, expected_offset: int | None = None) -> int:
        self._appends += 1
        if data and self._appends % 40 == 0:
            info = await self._store.stat(name)
            return int(getattr(info, "appended_length", 0))
        return await self._store.append(name, data, expected_offset=expected_offset)


class LosingHost(InProcessHost):
    @asynccontextmanager
    async def session(self, *, kill_at_end: Callable[[], bool]) -> AsyncIterator[SegmentStoreAPI]:
        async with super().session(kill_at_end=kill_at_end) as store:
            yield LosingStore(store)  # type: ignore[misc]


async def test_a_lost_append_is_caught(tmp_path: Path) -> None:
    with pytest.raises(Divergence, match="seed 1, operation"):
        await run_model(LosingHost(tmp_path / "data"), seed=1, operations=4000)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 16))
async def test_in_process_store_matches_the_model_long(tmp_path: Path, seed: int) -> None:
    await run_model(InProcessHost(tmp_path / "data"), seed=seed, operations=20_000)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20, 23))
async def test_daemon_matches_the_model_long(tmp_path: Path, seed: int) -> None:
    await run_model(DaemonHost(tmp_path / "data"), seed=seed, operations=6000)
