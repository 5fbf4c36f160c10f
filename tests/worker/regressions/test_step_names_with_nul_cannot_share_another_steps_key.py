"""Finding: ``ctx.step_key(name)`` joined the run, the delivery number and the step name with
NUL characters, and step names could hold NUL: step ``"1\\0charge"`` of a run's first
delivery had the same idempotency key as step ``"charge"`` of its first continuation, so a
downstream service de-duplicating on it would drop the second, different effect. Step names
are refused when they hold a NUL (by ``ctx.step`` and ``ctx.step_key`` alike)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from tasklease import protocol
from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.core.identity import DeliveryIdentity, Kind
from tasklease.worker.stores.sqlite.store import SqliteStore
from tests.support.helpers import FakeClock, task_headers

RUN_ID = DeliveryIdentity(Kind.TASK, "h", queue="default", task_name="t-1").run_id


class _Producer:
    def enqueue(self, *args: Any, **kwargs: Any) -> None:
        """The continuation's task: delivered by hand below."""


def test_a_step_name_with_a_nul_is_refused_rather_than_sharing_a_later_deliverys_key(
    tmp_path: Path,
) -> None:
    keys: dict[int, str] = {}
    errors: list[str] = []

    def handler(payload: Any, ctx: TaskContext) -> None:
        name = "1\0charge" if ctx.continuation == 0 else "charge"
        try:
            keys[ctx.continuation] = ctx.step(name, lambda: ctx.step_key(name))
        except Exception as exc:  # Refused: the run goes on without that step.
            errors.append(str(exc))
        if ctx.continuation == 0:
            ctx.continue_later({}, delay=timedelta(0))

    router = Router()
    router.task("h")(handler)
    router.use_producer(_Producer())  # type: ignore[arg-type]
    store = SqliteStore(tmp_path / "runs.db")
    client = create_app(router, store=store, auth="none", clock=FakeClock()).test_client()
    for task, extra in [("t-1", {}), ("c-1", {protocol.CONTINUATION_HEADER: f"{RUN_ID}:1"})]:
        answer = client.post("/tasks/h", headers=task_headers(task=task) | extra, data="{}")
        assert answer.headers[protocol.OUTCOME_HEADER] == "processed", answer.get_json()
    assert len(set(keys.values())) == len(keys)  # No two steps share a key.
    assert errors and "NUL" in errors[0]
