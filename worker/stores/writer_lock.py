"""A cross-process writer lock on ``<file>.lock``: processes take turns at a SQLite file.

SQLite's own busy handler waits for a locked file by sleeping, in steps of up to 100 ms, so
under contention a writer can idle long after the lock came free. An ``flock`` wait is a
kernel wait, woken the moment the lock is released. The lock is an optimisation only:
SQLite's write lock still decides who writes, so a writer that takes no ``flock`` (an older
tasklease, the sqlite3 shell) stays safe, and so does a wait given up on.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class WriterLockTimeout(Exception):
    """Another process held the lock for longer than the wait allowed."""


class WriterLock:
    """``flock`` on ``path``, opened once per process (a descriptor inherited across a fork
    shares its lock with the parent's, so a child opens its own)."""

    def __init__(self, path: Path, prepare: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self._prepare = prepare
        self._opened: tuple[int, int] | None = None  # (pid, descriptor)
        self._open_lock = threading.Lock()

    @contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        """Hold the lock for the block; raise :class:`WriterLockTimeout` after ``timeout``."""
        descriptor = self._descriptor()
        self._acquire(descriptor, timeout)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._opened is not None and self._opened[0] == os.getpid():
            os.close(self._opened[1])
        self._opened = None

    def _acquire(self, descriptor: int, timeout: float) -> None:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # Uncontended: no thread, no wait.
        except BlockingIOError:
            pass
        # Contended: wait in the kernel on a helper thread, so that this thread can give up
        # after the timeout (a blocking flock cannot be interrupted from Python). A helper
        # that gets the lock after its waiter gave up releases it at once.
        got = threading.Event()
        gave_up = False
        decided = threading.Lock()

        def wait_for_lock() -> None:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            with decided:
                if gave_up:
                    fcntl.flock(descriptor, fcntl.LOCK_UN)
                else:
                    got.set()

        threading.Thread(target=wait_for_lock, name="tasklease-writer-lock", daemon=True).start()
        if got.wait(timeout):
            return
        with decided:
            if got.is_set():
                return
            gave_up = True
        raise WriterLockTimeout(f"{self.path} was held by another process for over {timeout} s")

    def _descriptor(self) -> int:
        pid = os.getpid()
        opened = self._opened
        if opened is None or opened[0] != pid:
            with self._open_lock:
                opened = self._opened
                if opened is None or opened[0] != pid:
                    self._prepare()
                    descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                    opened = self._opened = (pid, descriptor)
        return opened[1]
