"""Firestore faults scripted into a store's documents: a call that fails, after or before
really running (a write that landed although its call failed, a read that cannot answer)."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as api

from tasklease.worker.stores import FirestoreStore

# A write that reached the database, whose call then failed: the caller cannot tell it landed.
LANDED_THEN_FAILED = api.DeadlineExceeded("deadline exceeded after the write landed")


class Scripted:
    """Scripts a store's documents: their next calls raise (after or before really running)."""

    def __init__(self, store: FirestoreStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.script: dict[str, list[tuple[BaseException, bool, Any]]] = {}
        documents = store.runs.document
        monkeypatch.setattr(
            store.runs, "document", lambda run_id: _Document(documents(run_id), self)
        )

    def fail(
        self, method: str, error: BaseException, *, after_running: bool = False, before: Any = None
    ) -> None:
        """The next ``method`` call runs ``before()``, then (maybe) really runs, then raises."""
        self.script.setdefault(method, []).append((error, after_running, before))


class _Document:
    def __init__(self, inner: Any, scripted: Scripted) -> None:
        self._inner = inner
        self._scripted = scripted

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in ("create", "update", "get"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            steps = self._scripted.script.get(name)
            if steps:
                error, after_running, before = steps.pop(0)
                if before is not None:
                    before()
                if after_running:
                    target(*args, **kwargs)
                raise error
            return target(*args, **kwargs)

        return call
