"""A gunicorn worker forked while a thread of its parent held the lock of the remembered
writes (or of the claims noted to give back) must still start: the child forgets what its
parent remembered without waiting on a lock that no thread of the child will ever release."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest

from tasklease.worker.stores.base.conditional_claims import RememberedWrites
from tasklease.worker.stores.base.orphans import OrphanClaims


@contextmanager
def held(lock: threading.Lock) -> Iterator[None]:
    """``lock`` held by another thread until the block ends."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        holder.join()


def child_finishes(forget: Callable[[], None]) -> bool:
    """Fork; the child calls ``forget`` and exits 0. Whether it did within 10 s."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Forking with threads, as gunicorn.
        pid = os.fork()
    if pid == 0:
        forget()
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def never_called(run_id: str, attempt_id: str, claimed_at: datetime) -> None:
    raise AssertionError("nothing is given back here")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork only")
def test_the_remembered_writes_are_forgotten_in_a_child_forked_while_their_lock_is_held() -> None:
    writes: RememberedWrites[int] = RememberedWrites()
    with held(writes._lock):
        assert child_finishes(writes.forget_all)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork only")
def test_the_noted_claims_are_forgotten_in_a_child_forked_while_their_lock_is_held() -> None:
    orphans = OrphanClaims(never_called)
    with held(orphans._lock):
        assert child_finishes(orphans.forget_all)
