"""The cross-process writer lock: contended waits are handed to one waiter thread per
process, a wait given up on leaves the lock free, and the next waiter still gets it."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tasklease.plumbing.writer_lock import WriterLock, WriterLockTimeout


@contextmanager
def held_elsewhere(path: Path) -> Iterator[int]:
    """Hold ``path``'s flock through a separate open file description, which conflicts with
    the lock's own exactly as another process's would."""
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        yield other
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)


def waiter_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tasklease-writer-lock"]


def test_contended_waits_share_one_waiter_thread(tmp_path: Path) -> None:
    lock = WriterLock(tmp_path / "runs.db.lock")
    before = len(waiter_threads())
    entered = 0
    for _ in range(20):
        with held_elsewhere(lock.path):
            took = threading.Event()

            def take(took: threading.Event = took) -> None:
                with lock.held(timeout=10):
                    took.set()

            thread = threading.Thread(target=take)
            thread.start()
            time.sleep(0.01)  # The wait is contended: it is on the waiter thread by now.
            assert not took.is_set()
        thread.join(timeout=10)
        entered += took.is_set()
    assert entered == 20
    assert len(waiter_threads()) == before + 1
    lock.close()


def test_a_wait_given_up_on_leaves_the_lock_free_for_the_next(tmp_path: Path) -> None:
    lock = WriterLock(tmp_path / "runs.db.lock")
    with held_elsewhere(lock.path), pytest.raises(WriterLockTimeout), lock.held(timeout=0.05):
        pass  # pragma: no cover - never entered
    # The waiter got the lock after its requester had gone, and released it at once: this
    # process and others can take it.
    deadline = time.monotonic() + 10
    while True:
        other = os.open(lock.path, os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(other, fcntl.LOCK_UN)
            break
        except BlockingIOError:
            assert time.monotonic() < deadline, "the given-up wait kept the lock"
            time.sleep(0.01)
        finally:
            os.close(other)
    with held_elsewhere(lock.path):
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(_take(lock)))
        thread.start()
        time.sleep(0.01)
    thread.join(timeout=10)
    assert result == [True]
    lock.close()


def _take(lock: WriterLock) -> bool:
    with lock.held(timeout=10):
        return True
