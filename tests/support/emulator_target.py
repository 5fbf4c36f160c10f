"""A scriptable HTTP target for the emulator's dispatch tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from werkzeug import Request, Response


@dataclass
class Hit:
    at: float
    headers: dict[str, str]
    body: bytes


class Target:
    """Records each request; ``answer(hit_number)`` decides the response (default 200)."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.answer: Callable[[int], Response] = lambda n: Response("ok")
        self.delay = 0.0
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Response:
        with self._lock:
            self.hits.append(Hit(time.monotonic(), dict(request.headers), request.get_data()))
            number = len(self.hits)
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay:
                time.sleep(self.delay)
            return self.answer(number)
        finally:
            with self._lock:
                self.concurrent -= 1
