"""A pool of threads for the dispatcher's attempts, cheaper per call than ThreadPoolExecutor.

ThreadPoolExecutor makes a Future (with its Condition) and a work item per call, and checks its
thread count with a semaphore and a weak reference each time: in the throughput benchmark's
profile, submitting cost a tenth of the emulator's CPU. The dispatcher needs none of it (an
attempt records its own outcome), so calls go through a SimpleQueue to threads that are
started as needed, up to a maximum, and kept.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

_log = logging.getLogger("tasklease.emulator")


class Workers:
    """Runs each submitted call on one of at most ``max_threads`` threads, in order of
    submission; calls wait in a queue while all threads are busy."""

    def __init__(self, max_threads: int, name: str) -> None:
        self._max_threads = max_threads
        self._name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Threads waiting for a call that no submitted call has been counted against yet.
        self._idle = 0
        self._stopping = False

    def submit(self, call: Callable[[], None]) -> None:
        self._calls.put(call)
        with self._lock:
            if self._idle:
                self._idle -= 1  # That thread will take this call (or an earlier one).
                return
            if self._stopping or len(self._threads) >= self._max_threads:
                return
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Drop the calls not started yet; wait for the running ones to end."""
        with self._lock:
            self._stopping = True
            threads = list(self._threads)
        for _ in threads:
            self._calls.put(None)
        for thread in threads:
            thread.join(timeout)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            if self._stopping:
                continue
            try:
                call()
            except Exception:
                _log.exception("dispatch worker call failed")
            with self._lock:
                self._idle += 1
