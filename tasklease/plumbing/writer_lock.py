"""A cross-process writer lock on ``<file>.lock``: processes take turns at a SQLite file.

SQLite's own busy handler waits for a locked file by sleeping, in steps of up to 100 ms, so
under contention a writer can idle long after the lock came free. An ``flock`` wait is a
kernel wait, woken the moment the lock is released. The lock is an optimisation only:
SQLite's write lock still decides who writes, so a writer that takes no ``flock`` (an older
tasklease, the sqlite3 shell) stays safe, and so does a wait given up on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tasklease.errors import TaskleaseError
from tasklease.plumbing.per_process import PerProcess
from tasklease.plumbing.private_files import open_private


class WriterLockTimeout(TaskleaseError):
    """Another process held the lock for longer than the wait allowed."""


@dataclass
class _Request:
    """One contended acquisition, handed to the process's waiter thread."""

    descriptor: int
    got: threading.Event = field(default_factory=threading.Event)
    decided: threading.Lock = field(default_factory=threading.Lock)
    gave_up: bool = False


class WriterLock:
    """``flock`` on ``path``, opened once per process (a descriptor inherited across a fork
    shares its lock with the parent's, so a child opens its own)."""

    def __init__(self, path: Path, prepare: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self._prepare = prepare
        self._descriptor = PerProcess(self._open)
        # The process's waiter thread's requests (see _acquire).
        self._requests = PerProcess(_start_waiter)

    @contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        """Hold the lock for the block; raise :class:`WriterLockTimeout` after ``timeout``."""
        descriptor = self._descriptor.get()
        self._acquire(descriptor, timeout)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)

    def close(self) -> None:
        descriptor = self._descriptor.made_here()
        if descriptor is not None:
            os.close(descriptor)
        self._descriptor.forget()

    def _acquire(self, descriptor: int, timeout: float) -> None:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # Uncontended: no hand-off, no wait.
        except BlockingIOError:
            pass
        # Contended: a blocking flock cannot be interrupted from Python, so the wait happens
        # on the process's waiter thread and this thread can give up after the timeout. One
        # long-lived thread, not one per wait: under load most acquisitions are contended,
        # and starting a thread costs more than the write it would let through.
        request = _Request(descriptor)
        self._requests.get().put(request)
        if request.got.wait(timeout):
            return
        with request.decided:
            if request.got.is_set():
                return
            request.gave_up = True
        raise WriterLockTimeout(f"{self.path} was held by another process for over {timeout} s")

    def _open(self) -> int:
        self._prepare()
        # Someone else's lock file could be held by them for ever: refused (ConfigurationError).
        return open_private(self.path)


def _start_waiter() -> queue.SimpleQueue[_Request]:
    """Start a process's waiter thread; the queue it takes requests from."""
    requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
    thread = threading.Thread(
        target=_wait_for_lock, args=(requests,), name="tasklease-writer-lock", daemon=True
    )
    thread.start()
    return requests


def _wait_for_lock(requests: queue.SimpleQueue[_Request]) -> None:
    """Take the lock for each request in turn; a request given up on meanwhile gets its lock
    released at once. Requests queue behind a wait in progress, which is right: that wait is
    for the same lock."""
    while True:
        request = requests.get()
        try:
            fcntl.flock(request.descriptor, fcntl.LOCK_EX)
        except OSError:  # The descriptor was closed (the store closed): nobody to hand it to.
            continue
        with request.decided:
            if not request.gave_up:
                request.got.set()
                continue
        with contextlib.suppress(OSError):  # Closed meanwhile: closing released the lock.
            fcntl.flock(request.descriptor, fcntl.LOCK_UN)
