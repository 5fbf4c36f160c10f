"""Many processes opening one fresh SQLite file at once (gunicorn workers starting together)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.stores import SqliteStore


def _open_and_read(path: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        SqliteStore(path).get("anything")
        results.put("ok")
    except Exception as exc:
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("round_", range(3))
def test_eight_processes_opening_a_fresh_file_together_all_succeed(
    tmp_path: Path, round_: int
) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(8), context.Queue()
    path = str(tmp_path / f"fresh-{round_}.db")
    processes = [
        context.Process(target=_open_and_read, args=(path, barrier, results)) for _ in range(8)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=10)
    assert outcomes == ["ok"] * 8
