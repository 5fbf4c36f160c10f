"""Finding: the cross-process writer lock (``flock`` on ``<db>.lock``) is taken with a
blocking LOCK_EX and no timeout, so one process that holds it and stalls (stopped, frozen on
a slow disk, or simply waiting out busy_timeout behind a writer that skips the flock) makes
every other process's claims, renewals and finishes wait without bound, instead of answering
StoreUnavailable (503) after ``busy_timeout`` as the store promises."""

from __future__ import annotations

import fcntl
import os
import threading
from datetime import timedelta
from pathlib import Path

from tasklease.errors import StoreUnavailable
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import T0, claim_request


def test_a_claim_gives_up_within_busy_timeout_while_another_process_holds_the_writer_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path, busy_timeout=timedelta(seconds=0.5))
    store.get("warm-up")  # Creates the file and its schema.
    # Another process's writer holds <db>.lock and stalls (a separate open file description
    # conflicts with the store's exactly as another process's would).
    other = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)
    outcome: list[object] = []

    def claim() -> None:
        try:
            outcome.append(store.claim(claim_request(), T0))
        except StoreUnavailable as exc:
            outcome.append(exc)

    worker = threading.Thread(target=claim, daemon=True)
    worker.start()
    try:
        worker.join(timeout=10)  # 20x busy_timeout: generous on a loaded machine.
        finished = not worker.is_alive()
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)  # Let the stuck claim finish.
        os.close(other)
        worker.join(timeout=30)
    assert finished, "the claim was still waiting for <db>.lock after 10 s"
    assert isinstance(outcome[0], StoreUnavailable)
